// The backward pass of one rank, as a table (docs/backward-design.md explains
// the dataflow; the vocabulary is pass_table.hpp's). The fused backward
// kernel runs it (src/device/kernel/fused_backward_kernel.cuh). Its ticket
// order is checked against its waits on the CPU
// (tests/cpu/test_pass_protocol.cpp), as the forward's is, and its structure
// at compile time (pass_table_is_consistent).
//
//   kind                 rows      A            B (major)         K        out              waits                 signals
//   shared g + SwiGLU'   tokens    dout         shared W2 (MN)    H        shared d13, h    -                     shared_d13_ready,
//                                                                                                                  shared_grad_done
//   shared dx            tokens    shared d13   shared W13 (MN)   2S       shared dx        shared_d13_ready      shared_done
//   g + SwiGLU'          schedule  dout rows    W2[e] (MN)        H        d13 rows, w*h    rows_filled           d13_ready, expert_rows_done
//                                                                           (and <g,h> parts to the home (t, j))
//   dx_j                 schedule  d13 rows     W13[e] (MN)       2I       dx rows (TMA)    d13_ready             dx_done (late)
//   shared dW13 tile     tokens^T  shared d13^T x (MN)            T        fp32 shared dW13 shared_grad_done      -
//   shared dW2 tile      tokens^T  dout^T       shared h (MN)     T        fp32 shared dW2  shared_grad_done      -
//   dW13[e] tile         expert    d13 rows^T   x rows (MN)       rows(e)  fp32 dW13[e]     expert_rows_done[e]   -
//   dW2[e] tile          expert    dout rows^T  w*h rows (MN)     rows(e)  fp32 dW2[e]      expert_rows_done[e]   -
//
//   dispatch of an m-tile: pulls the dout and x rows of its schedule rows into
//     buffers that hold the whole schedule (nothing is recycled inside the
//     pass: the weight gradients read every row of an expert), then signals
//     rows_filled; it waits for nothing.
//   combine (home rank): waits for shared_done and every owner's dx_done, then
//     dx = shared dx + sum_j dx_j in slot order, and dweights from the parts
//     in n-tile order. It reads dx_j of (token, slot) from the owner's dx
//     rows, at the schedule row the owner's dispatch wrote into the home's
//     dx_row_of when it pulled that row's dout.
//
// Ticket order: the shared expert's kinds, then the pipeline (each step: dx of
// minibatch m - L, n-tile major, then g of minibatch m), then the finale: the
// shared expert's weight gradients (K = T, the longest tiles of the finale,
// so first), then expert by expert its dW13 tiles, then its dW2 tiles.
// The buffers never wrap: the host gives this pass as many "ring" slots as
// the largest schedule has minibatches, so every generation is 0.
#pragma once

#include <cstdint>

#include "common/gemm_tile_shape.hpp"
#include "protocol/counters.hpp"
#include "protocol/pass_table.hpp"

namespace mok::protocol {

// The backward's tile shapes: 128 x 256 bf16 tiles; data gradients read
// their weights MN-major (dx = dy . W), weight gradients both operands.
inline constexpr GemmTileShape kBackwardGradTile{128, 256, EpilogueKind::kSwiGLUBackward, ElementType::kBF16,
                                                 OperandMajor::kMN};
inline constexpr GemmTileShape kBackwardDxTile{128, 256, EpilogueKind::kPlain, ElementType::kBF16, OperandMajor::kMN};
inline constexpr GemmTileShape kBackwardWeightTile{128, 256, EpilogueKind::kWeightGrad, ElementType::kBF16,
                                                   OperandMajor::kMN, OperandMajor::kMN};

// What the save-mode and recompute-mode tables share: their first counters
// (in the same order, so that the kinds below name the same indices in
// both), the kinds that follow g, and the non-GEMM roles.
struct BackwardCommon {
  enum Counter : int32_t {
    kRowsFilled,      // per m-tile: its dout and x rows are in place (stored by its dispatch worker)
    kD13Ready,        // per m-tile: g tasks that stored their [da | db] columns
    kExpertRowsDone,  // per local expert: g tasks of its m-tiles (every row's d13 and w*h exist)
    kSharedD13Ready,  // per token tile: shared g tasks that stored their columns
    kSharedDone,      // shared dx tasks done (the combine reads shared dx)
    kDxDone,          // dx tasks whose rows are in their home ranks' rows
    kSharedGradDone,  // shared g tasks done (every token's shared d13 and h exist)
    kCommonCounters,
  };
  static constexpr CounterSpec kCommonCounterSpecs[kCommonCounters] = {
      {static_cast<uint32_t>(CounterId::kRowsFilled), Span::kRingTile, true},
      {static_cast<uint32_t>(CounterId::kD13Ready), Span::kRingTile, false},
      {static_cast<uint32_t>(CounterId::kExpertRowsDone), Span::kExpert, false},
      {static_cast<uint32_t>(CounterId::kSharedD13Ready), Span::kTokenTile, false},
      {static_cast<uint32_t>(CounterId::kSharedDone), Span::kWhole, false},
      {static_cast<uint32_t>(CounterId::kDxDone), Span::kWhole, false},
      {static_cast<uint32_t>(CounterId::kSharedGradDone), Span::kWhole, false},
  };

  // The g kinds (g = dout . W2, then the SwiGLU backward in the epilogue),
  // which the two modes give different inputs to wait for: the shared
  // expert's (token rows: [da | db] and h) and the routed one's (schedule
  // rows: [da | db], w*h and the <g, h> parts to the home (t, j)).
  static constexpr TaskKindSpec shared_grad_kind(CounterWait wait) {
    return {kBackwardGradTile, Tensor::kDout,     Tensor::kSharedW2, Dim::kHidden,
            Dim::kSharedWidth, Rows::kTokens,     Tensor::kSharedD13, {wait},
            {{kSharedD13Ready}, {kSharedGradDone}}, Dim::kNone,       Tensor::kSharedH, Tensor::kSharedPreact};
  }
  static constexpr TaskKindSpec grad_kind(CounterWait wait) {
    return {kBackwardGradTile, Tensor::kDoutRows,  Tensor::kW2,     Dim::kHidden,
            Dim::kIntermediate, Rows::kSchedule,   Tensor::kD13Rows, {wait},
            {{kD13Ready}, {kExpertRowsDone}},      Dim::kNone,       Tensor::kHwRows, Tensor::kPreactRows};
  }
  // shared dx = shared d13 . shared W13
  static constexpr TaskKindSpec kSharedDxKind = {
      kBackwardDxTile, Tensor::kSharedD13, Tensor::kSharedW13, Dim::kTwoSharedWidth, Dim::kHidden, Rows::kTokens,
      Tensor::kSharedDx, {{kSharedD13Ready, Await::kReady}}, {{kSharedDone}}};
  // dx_j = d13 rows . W13[e], by schedule row into the owner's dx rows (TMA
  // boxes, as the weight gradients' bf16 tiles; a tile of 16-byte stores to
  // the home rows held each later barrier operation of its warps until the
  // stores had left the SM: docs/perf-notes.md v12). Its signal comes late
  // (protocol::signals_late): the stores complete during the next task.
  static constexpr TaskKindSpec kDxKind = {
      kBackwardDxTile, Tensor::kD13Rows, Tensor::kW13, Dim::kTwoIntermediate, Dim::kHidden, Rows::kSchedule,
      Tensor::kDxRows, {{kD13Ready, Await::kReady}}, {{kDxDone}}};
  // dW13[e] = d13 rows^T . x rows, over the expert's rows in schedule order.
  static constexpr TaskKindSpec kWeightGrad13Kind = {
      kBackwardWeightTile, Tensor::kD13Rows, Tensor::kXRows, Dim::kNone, Dim::kHidden, Rows::kExpert,
      Tensor::kWeightGrad13, {{kExpertRowsDone, Await::kReady}}, {}, Dim::kTwoIntermediate};
  // dW2[e] = dout rows^T . (w * h) rows.
  static constexpr TaskKindSpec kWeightGrad2Kind = {
      kBackwardWeightTile, Tensor::kDoutRows, Tensor::kHwRows, Dim::kNone, Dim::kIntermediate, Rows::kExpert,
      Tensor::kWeightGrad2, {{kExpertRowsDone, Await::kReady}}, {}, Dim::kHidden};
  // The shared expert's: dW13 = shared d13^T . x and dW2 = dout^T . shared h,
  // over the rank's tokens in order.
  static constexpr TaskKindSpec kSharedWeightGrad13Kind = {
      kBackwardWeightTile, Tensor::kSharedD13, Tensor::kX, Dim::kNone, Dim::kHidden, Rows::kTokenReduce,
      Tensor::kSharedWeightGrad13, {{kSharedGradDone, Await::kReady}}, {}, Dim::kTwoSharedWidth};
  static constexpr TaskKindSpec kSharedWeightGrad2Kind = {
      kBackwardWeightTile, Tensor::kDout, Tensor::kSharedH, Dim::kNone, Dim::kSharedWidth, Rows::kTokenReduce,
      Tensor::kSharedWeightGrad2, {{kSharedGradDone, Await::kReady}}, {}, Dim::kHidden};

  // Its buffers must hold every schedule row (nothing awaits a slot's
  // readers): the host gives it a slot per minibatch (buffers_hold_schedule).
  static constexpr bool kWholeSchedule = true;
  // It runs over the schedule its forward kept (the caller's pass state).
  static constexpr bool kScheduleGiven = true;
  // d13 rows are A of dx (K-major) and of dW13 (MN-major): a map per operand.
  static constexpr bool kMapPerOperand = true;

  struct Dispatch {
    static constexpr RoleSpec value = {{}, {{kRowsFilled}}, {Tensor::kDoutRows, Tensor::kXRows}};
  };
  struct Combine {
    static constexpr RoleSpec value = {{{kSharedDone, Await::kReady}, {kDxDone, Await::kReady}},
                                       {},
                                       {},
                                       {Tensor::kDxRows, Tensor::kSharedDx}};
  };
};

struct BackwardPass : BackwardCommon {
  enum Kind : int32_t {
    kSharedGrad, kSharedDx, kGrad, kDx, kWeightGrad13, kWeightGrad2, kSharedWeightGrad13, kSharedWeightGrad2, kNumKinds
  };
  static constexpr int32_t kNumCounters = kCommonCounters;
  // An array of its own, not a reference to the common one: device code may
  // not name a host reference member (nvcc warning 20094 where the host's
  // counter carving is compiled for both sides).
  static constexpr CounterSpec kCounters[kNumCounters] = {
      kCommonCounterSpecs[kRowsFilled],      kCommonCounterSpecs[kD13Ready],   kCommonCounterSpecs[kExpertRowsDone],
      kCommonCounterSpecs[kSharedD13Ready],  kCommonCounterSpecs[kSharedDone], kCommonCounterSpecs[kDxDone],
      kCommonCounterSpecs[kSharedGradDone],
  };
  static_assert(kCommonCounters == 7, "BackwardPass::kCounters lists every common counter");

  static constexpr TaskKindSpec kKinds[kNumKinds] = {
      shared_grad_kind({}),  // kSharedGrad: waits for nothing (its operands are inputs)
      kSharedDxKind,
      grad_kind({kRowsFilled, Await::kReady}),  // kGrad: its dout rows are in
      kDxKind,
      kWeightGrad13Kind,
      kWeightGrad2Kind,
      kSharedWeightGrad13Kind,
      kSharedWeightGrad2Kind,
  };

  static constexpr int32_t kPrologue[] = {kSharedGrad, kSharedDx};
  // dx_j n-tile major: W13[e]'s 2I x 256 panels of all H / 256 n-tiles
  // (~56 MB on the DeepSeek-V3 slice) exceed L2, and m-tile-major waves
  // re-read them from HBM.
  static constexpr PipelineEntry kPipeline[] = {{kDx, true, true}, {kGrad, false}};
  static constexpr int32_t kTokenFinale[] = {kSharedWeightGrad13, kSharedWeightGrad2};
  static constexpr int32_t kFinale[] = {kWeightGrad13, kWeightGrad2};
};

static_assert(pass_table_is_consistent<BackwardPass>(), "the backward's table breaks a rule of pass_table.hpp");

// The backward in recompute mode (mok::BackwardMode::kRecompute; its order
// and dataflow are checked on the CPU as save mode's). The forward kept nothing but
// its schedule: the pre-activations are recomputed from the pulled x rows
// (and the shared expert's from x) by a gate/up GEMM that keeps [gate | up]
// instead of h, before the g tasks that read them.
//
//   kind                 rows      A         B (major)       K   out              waits                 signals
//   shared recompute     tokens    x         shared W13 (K)  H   shared preact    -                     shared_preact_ready
//   shared g + SwiGLU'   tokens    dout      shared W2 (MN)  H   shared d13, h    shared_preact_ready   shared_d13_ready
//   recompute            schedule  x rows    W13[e] (K)      H   preact rows      rows_filled           preact_ready
//   g + SwiGLU'          schedule  dout rows W2[e] (MN)      H   d13 rows, w*h    preact_ready          d13_ready, expert_rows_done
//   (shared dx, dx_j, dW13, dW2 as in save mode)
//
// g(m) waits for preact_ready(m) only: recompute(m) waited for rows_filled(m),
// which the dispatch raised once both the dout and the x rows were in. Each
// pipeline step issues dx(m - L), then recompute(m), then g(m): g(m) waits for
// tasks earlier in the same step.
inline constexpr GemmTileShape kBackwardRecomputeTile{128, 256, EpilogueKind::kGateUpPreact};

struct BackwardRecomputePass : BackwardCommon {
  enum Kind : int32_t {
    kSharedRecompute, kSharedGrad, kSharedDx, kRecompute, kGrad, kDx, kWeightGrad13, kWeightGrad2,
    kSharedWeightGrad13, kSharedWeightGrad2, kNumKinds
  };
  enum RecomputeCounter : int32_t {
    kPreactReady = kCommonCounters,  // per m-tile: recompute tasks that stored their [gate | up] columns
    kSharedPreactReady,              // per token tile: the shared expert's
    kNumCounters
  };
  static constexpr CounterSpec kCounters[kNumCounters] = {
      kCommonCounterSpecs[kRowsFilled],
      kCommonCounterSpecs[kD13Ready],
      kCommonCounterSpecs[kExpertRowsDone],
      kCommonCounterSpecs[kSharedD13Ready],
      kCommonCounterSpecs[kSharedDone],
      kCommonCounterSpecs[kDxDone],
      kCommonCounterSpecs[kSharedGradDone],
      {static_cast<uint32_t>(CounterId::kPreactReady), Span::kRingTile, false},
      {static_cast<uint32_t>(CounterId::kSharedPreactReady), Span::kTokenTile, false},
  };

  static constexpr TaskKindSpec kKinds[kNumKinds] = {
      // kSharedRecompute: [gate | up] = x . shared W13^T, kept.
      {kBackwardRecomputeTile, Tensor::kX, Tensor::kSharedW13, Dim::kHidden, Dim::kSharedWidth, Rows::kTokens,
       Tensor::kSharedPreact, {}, {{kSharedPreactReady}}},
      shared_grad_kind({kSharedPreactReady, Await::kReady}),  // kSharedGrad: its recomputed pre-activations
      kSharedDxKind,
      // kRecompute: [gate | up] of the schedule's rows, kept by schedule row.
      {kBackwardRecomputeTile, Tensor::kXRows, Tensor::kW13, Dim::kHidden, Dim::kIntermediate, Rows::kSchedule,
       Tensor::kPreactRows, {{kRowsFilled, Await::kReady}}, {{kPreactReady}}},
      grad_kind({kPreactReady, Await::kReady}),  // kGrad: its recomputed pre-activations
      kDxKind,
      kWeightGrad13Kind,
      kWeightGrad2Kind,
      kSharedWeightGrad13Kind,
      kSharedWeightGrad2Kind,
  };

  static constexpr int32_t kPrologue[] = {kSharedRecompute, kSharedGrad, kSharedDx};
  static constexpr PipelineEntry kPipeline[] = {{kDx, true, true}, {kRecompute, false}, {kGrad, false}};
  static constexpr int32_t kTokenFinale[] = {kSharedWeightGrad13, kSharedWeightGrad2};
  static constexpr int32_t kFinale[] = {kWeightGrad13, kWeightGrad2};
};

static_assert(pass_table_is_consistent<BackwardRecomputePass>(),
              "the backward's recompute table breaks a rule of pass_table.hpp");

using BackwardGeometry = PassGeometry<BackwardPass>;

}  // namespace mok::protocol
