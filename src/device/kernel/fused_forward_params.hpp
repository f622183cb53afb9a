// The fused forward kernel's parameters: what every rank of a world exposes
// to every other (its buffers, its counters, its tensor maps). The virtual
// world fills R of them for R partitions of one GPU; a real world fills them
// with peer pointers. Plain data, shared by host and device code.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "mok/layer_config.hpp"
#include "mok/pass_trace.hpp"
#include "mok/row_source.hpp"
#include "protocol/pass_forward.hpp"
#include "protocol/world_barrier.hpp"

namespace mok::device {

// The TMA tensor maps of one rank, in global memory (64-byte aligned).
enum MapIndex : int {
  kMapRingX = 0,     // 2-D {H, ring rows}: A of routed gate/up
  kMapW13 = 1,       // 4-D {H, I, 2, El}: B of routed gate/up
  kMapRingH = 2,     // 2-D {I, ring rows}: A of routed down
  kMapW2 = 3,        // 3-D {I, H, El}: B of routed down
  kMapX = 4,         // 2-D {H, T}: A of shared gate/up
  kMapSharedW13 = 5, // 4-D {H, S, 2, 1}
  kMapSharedH = 6,   // 2-D {S, T}: A of shared down
  kMapSharedW2 = 7,  // 3-D {S, H, 1}
  kNumMaps = 8,
};
// A task's operand names its map: the pass tables' tensors and these indices agree.
static_assert(kMapRingX == static_cast<int>(protocol::Tensor::kRingX) &&
                  kMapW13 == static_cast<int>(protocol::Tensor::kW13) &&
                  kMapRingH == static_cast<int>(protocol::Tensor::kRingH) &&
                  kMapW2 == static_cast<int>(protocol::Tensor::kW2) && kMapX == static_cast<int>(protocol::Tensor::kX) &&
                  kMapSharedW13 == static_cast<int>(protocol::Tensor::kSharedW13) &&
                  kMapSharedH == static_cast<int>(protocol::Tensor::kSharedH) &&
                  kMapSharedW2 == static_cast<int>(protocol::Tensor::kSharedW2) &&
                  kNumMaps == protocol::kNumMappedTensors,
              "tensor map indices are the pass tables' operand tensors");

struct RankView {
  // Inputs and output (the caller's tensors).
  const uint16_t* x;     // bf16 [T, H]
  const int32_t* ids;    // [T, k] global expert ids
  const float* weights;  // [T, k]
  uint16_t* out;         // bf16 [T, H]
  int32_t tokens;        // T
  // Workspace.
  uint16_t* ring_x;      // bf16 [ring rows, H]: the macrobatch of pulled rows
  uint16_t* ring_h;      // bf16 [ring rows, I]: SwiGLU activations of those rows
  uint16_t* combine;     // bf16 [T * k, H]: y per (token, slot), written by the expert owners
  uint16_t* shared_h;    // bf16 [T, S]
  uint16_t* shared_out;  // bf16 [T, H]
  int32_t* expert_rows;    // [El] schedule: real rows per local expert
  int32_t* expert_offset;  // [El + 1] padded offsets
  RowSource* rows;         // [row capacity] the schedule
  int32_t* schedule_hist;  // [schedule warps, El] chunk counts, then their exclusive scans
  protocol::ForwardCounters counters;
  const CUtensorMap* maps;  // [kNumMaps]
  // Device-ordered passes (protocol/world_barrier.hpp): the rank's barrier
  // words, and its counter set this pass does not use (zeroed at its end).
  protocol::WorldBarrierWords* barrier;
  uint32_t* idle_counters;
};

// Training mode, per rank (the caller's buffers; null: not kept): the gate/up
// pre-activations the backward reads instead of recomputing them, rounded
// once to bf16 from the accumulators h is computed from. Only the training
// instantiation of the kernel reads them (RoleContext::kTraining).
struct SavedPreactivations {
  uint16_t* routed;  // bf16 [schedule rows, 2I]: row = the rank's schedule row (its pass state's), gate | up
  uint16_t* shared;  // bf16 [T, 2S]: row = token
};

// The FP8 pass, per rank (LayerConfig::dtype kFP8E4M3; docs/fp8-forward-design.md):
// the scales beside the e4m3 bytes. There the view's w13 / w2 maps read e4m3
// weights, and ring_x / ring_h hold e4m3 rows (1 byte per value), each row's
// ue8m0 scales (one per 128 columns) in these workspace arrays, k-block-major
// (protocol/ring_scales.hpp: pitch = ring_scale_pitch(ring rows)), so that a
// tile's rows at one k-block are one bulk copy into its stage.
struct Fp8RankOperands {
  uint8_t* ring_x_scales;      // [H / 128, pitch]: written by the dispatch, which quantizes the pulled rows
  uint8_t* ring_h_scales;      // [I / 128, pitch]: written by the gate/up epilogue
  const uint8_t* w13_scales;   // [El, 2I / 128, H / 128] (the caller's, mok::fp8::quantize_weight's layout)
  const uint8_t* w2_scales;    // [El, H / 128, I / 128]
};

struct FusedForwardParams {
  using Pass = protocol::ForwardPass;  // the table the kernel's roles walk (role_context.cuh)
  RankView ranks[kMaxWorldSize];
  int32_t world_size;
  // The ranks this launch serves: [first_rank, first_rank + launch_ranks).
  // Virtual world: one launch serves every rank. Peer world: one launch per
  // GPU, each serving its own rank.
  int32_t first_rank;
  int32_t launch_ranks;
  int32_t hidden;        // H
  int32_t intermediate;  // I
  int32_t shared_width;  // S (0: no shared expert)
  int32_t top_k;
  int32_t num_local_experts;  // El
  int32_t tile_m;
  int32_t minibatch_rows;
  int32_t ring_slots;
  int32_t lookahead;
  int32_t ctas_per_rank;
  int32_t comm_ctas_per_rank;
  uint32_t n_major_kinds;  // protocol::PassShape::n_major_kinds (world::forward_n_major_kinds)
  uint64_t timeout_ns;
  // The pass trace (include/mok/pass_trace.hpp); null when tracing is off.
  TraceEvent* trace;        // [world blocks][trace_capacity], world block = first_rank * ctas_per_rank + block
  uint32_t* trace_count;    // [world blocks] events each block appended (may exceed the capacity)
  uint32_t trace_capacity;  // per block
  uint32_t epoch;               // 0: host-ordered pass; else this device-ordered pass's number (from 1)
  uint64_t barrier_timeout_ns;  // device-ordered: bound of the start and end barrier waits
  SavedPreactivations saved[kMaxWorldSize];  // training mode (last: the inference kernel's offsets do not move)
  Fp8RankOperands fp8[kMaxWorldSize];        // the FP8 pass (after the rest, for the same reason)
};

}  // namespace mok::device
