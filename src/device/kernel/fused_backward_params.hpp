// The fused backward kernel's parameters: what every rank exposes to every
// other in a backward pass (docs/backward-design.md). The GEMM roles read
// the fields every pass's views share under the forward's names (counters,
// maps, the schedule, tokens); the rest are the backward's own. Plain data,
// host and device.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "mok/layer_config.hpp"
#include "mok/pass_trace.hpp"
#include "mok/row_source.hpp"
#include "protocol/counters.hpp"
#include "protocol/pass_backward.hpp"
#include "protocol/world_barrier.hpp"

namespace mok::device {

// The backward's TMA tensor maps: one per operand of each task kind
// (protocol::map_index; a tensor read K-major by one kind and MN-major by
// another needs two maps), then the bf16 weight gradients' outputs
// and the dx rows (protocol::output_map).
template <class Pass>
inline constexpr int kBackwardMaps = protocol::num_backward_maps<Pass>();

// Where dx_j of one (token, slot) lies: the owner rank's dx rows, at its
// schedule row (written by the owner's dispatch into the home's dx_row_of).
struct DxRowOf {
  int32_t owner;
  int32_t row;
};

// Pass: protocol::BackwardPass (save mode) or BackwardRecomputePass.
template <class Pass>
struct BackwardRankViewOf {
  // Shared with the forward's view (the GEMM roles read these names).
  protocol::PassCounters<Pass> counters;
  const CUtensorMap* maps;  // [kBackwardMaps<Pass>]
  int32_t* expert_rows;     // [El] the forward's schedule (its pass state): real rows per local expert
  int32_t* expert_offset;   // [El + 1] padded offsets; the last, the schedule's padded rows
  RowSource* rows;          // [row capacity] home (rank, token, slot) of each schedule row
  int32_t tokens;           // T

  // The caller's inputs.
  const uint16_t* x;              // bf16 [T, H]
  const uint16_t* dout;           // bf16 [T, H]
  const float* weights;           // [T, k]
  // bf16 [row capacity, 2I]: [gate | up] by schedule row: the forward's in
  // save mode; in recompute mode kept_preact, which this pass writes first.
  const uint16_t* preact;
  const uint16_t* shared_preact;  // bf16 [T, 2S] (recompute: kept_shared_preact, [T rounded up to tile_m, 2S])
  // The caller's outputs.
  uint16_t* dx;            // bf16 [T, H]
  float* dweights;         // [T, k]
  void* dw13;              // [El, 2I, H]: fp32, or bf16 (weight_grad_bf16)
  void* dw2;               // [El, H, I]
  void* dshared_w13;       // [2S, H] (same type as dw13)
  void* dshared_w2;        // [H, S]

  // Workspace: rows of the whole schedule (nothing is recycled in a pass).
  uint16_t* dout_rows;     // bf16 [row capacity, H]: dout of each schedule row (dispatch)
  uint16_t* x_rows;        // bf16 [row capacity, H]: x of each schedule row (dispatch)
  float* w_rows;           // [row capacity]: the routing weight of each schedule row (dispatch)
  uint16_t* d13_rows;      // bf16 [row capacity, 2I]: [da | db] (g epilogue)
  uint16_t* hw_rows;       // bf16 [row capacity, I]: w h (g epilogue)
  float* dw_parts;         // [T * k, parts]: <g, h> per (token, slot) and n-tile, written by the owners
  uint16_t* dx_rows;       // bf16 [buffer rows, H]: dx_j of each schedule row (dx tasks, TMA boxes)
  DxRowOf* dx_row_of;      // [T * k]: where each (token, slot)'s dx_j lies, written by the owners' dispatch
  uint16_t* shared_d13;    // bf16 [T rounded up to tile_m, 2S]
  uint16_t* shared_h;      // bf16 [T rounded up to tile_m, S]: h of the shared expert (its dW2's operand)
  uint16_t* shared_dx;     // bf16 [T, H]
  uint32_t* combine_next;  // [1] the next token the rank's combine warps take (in the counter set, after the counters)
  // Device-ordered passes (protocol/world_barrier.hpp): the rank's barrier
  // words, and its other counter set, which the pass clears at its end.
  protocol::WorldBarrierWords* barrier;
  uint32_t* idle_counters;
  // Recompute mode: where its recompute kinds keep [gate | up] (workspace;
  // preact and shared_preact point here too). Null in save mode.
  uint16_t* kept_preact;         // bf16 [buffer rows, 2I]
  uint16_t* kept_shared_preact;  // bf16 [T rounded up to tile_m, 2S]
};

template <class PassT>
struct FusedBackwardParamsOf {
  using Pass = PassT;  // the table the roles walk
  // Words of a counter set past the pass's counters: the combine's cursor
  // (combine_next), cleared with them.
  static constexpr size_t kCounterSetTailWords = 1;
  BackwardRankViewOf<Pass> ranks[kMaxWorldSize];
  int32_t world_size;
  int32_t first_rank;
  int32_t launch_ranks;
  int32_t hidden;        // H
  int32_t intermediate;  // I
  int32_t shared_width;  // S (0: no shared expert)
  int32_t top_k;
  int32_t num_local_experts;  // El
  int32_t tile_m;
  int32_t minibatch_rows;
  int32_t ring_slots;    // minibatches of the largest schedule: the buffers never wrap
  int32_t lookahead;
  int32_t ctas_per_rank;
  int32_t comm_ctas_per_rank;
  uint32_t n_major_kinds;    // protocol::PassShape::n_major_kinds: 0 (the table's own n_major entries only)
  int32_t accumulate;        // nonzero: weight-gradient tiles are added to the caller's fp32 buffers
  int32_t weight_grad_bf16;  // nonzero: weight-gradient tiles are rounded once to bf16
  uint64_t timeout_ns;
  uint32_t epoch;               // 0: host-ordered pass; else this device-ordered pass's number (from 1)
  uint64_t barrier_timeout_ns;  // device-ordered: bound of the start and end barrier waits
  // The pass trace (include/mok/pass_trace.hpp); null when tracing is off.
  TraceEvent* trace;
  uint32_t* trace_count;
  uint32_t trace_capacity;
};

using BackwardRankView = BackwardRankViewOf<protocol::BackwardPass>;
using FusedBackwardParams = FusedBackwardParamsOf<protocol::BackwardPass>;
using BackwardRecomputeRankView = BackwardRankViewOf<protocol::BackwardRecomputePass>;
using FusedBackwardRecomputeParams = FusedBackwardParamsOf<protocol::BackwardRecomputePass>;
inline constexpr int kNumBackwardMaps = kBackwardMaps<protocol::BackwardPass>;

}  // namespace mok::device
