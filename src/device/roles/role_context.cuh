// What every role of the fused forward knows about itself: its rank's view,
// the world's parameters, the protocol backend, and the geometry of its
// rank's pass (known once the rank's schedule exists).
#pragma once

#include <cstdint>

#include "device/kernel/fused_forward_params.hpp"
#include "protocol/counters.hpp"
#include "protocol/device_sync.cuh"
#include "protocol/forward_plan.hpp"

namespace mok::device {

// Output columns of one gate/up (+SwiGLU) task and of one down task; the
// tile configurations of the fused kernel must agree (static_asserts there).
inline constexpr int kGateUpOutCols = 128;
inline constexpr int kDownOutCols = 256;
// Named barriers of the fused kernel (0 is __syncthreads).
enum NamedBarrier : int {
  kBarrierDispatch = 1,  // the copy warps of a dispatch CTA
};

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Warps per dispatch CTA, every one of which builds a share of the schedule
// (the fused kernel's CTA size; static_assert there).
inline constexpr int kScheduleWarpsPerCta = 12;

// Largest top-k the fused kernel's combine holds in registers.
inline constexpr int kMaxTopK = 16;

// A schedule row written earlier in this pass by another SM: read through L2.
__device__ __forceinline__ RowSource load_row_source(const RowSource* row) {
  const int32_t* p = reinterpret_cast<const int32_t*>(row);
  return RowSource{__ldcg(p), __ldcg(p + 1), __ldcg(p + 2)};
}

template <cuda::thread_scope kScope>
struct RoleContext {
  const FusedForwardParams& params;
  int32_t rank;
  protocol::DeviceSync<kScope> sync;

  __device__ const RankView& view() const { return params.ranks[rank]; }
  __device__ const protocol::ForwardCounters& counters() const { return view().counters; }

  // The pass's geometry for `padded_rows` schedule rows (0 before the schedule exists:
  // shared-expert tasks do not need it).
  __device__ protocol::ForwardGeometry geometry(int32_t padded_rows) const {
    protocol::ForwardGeometry g;
    g.padded_rows = padded_rows;
    g.tile_m = params.tile_m;
    g.minibatch_rows = params.minibatch_rows;
    g.ring_slots = params.ring_slots;
    g.lookahead = params.lookahead;
    g.gate_up_n_tiles = (params.intermediate + kGateUpOutCols - 1) / kGateUpOutCols;
    g.down_n_tiles = (params.hidden + kDownOutCols - 1) / kDownOutCols;
    const int32_t tokens = view().tokens;
    g.shared_m_tiles = params.shared_width > 0 ? (tokens + params.tile_m - 1) / params.tile_m : 0;
    g.shared_gate_up_n_tiles = (params.shared_width + kGateUpOutCols - 1) / kGateUpOutCols;
    g.shared_down_n_tiles = g.down_n_tiles;
    return g;
  }

  // Warps that build a rank's schedule (the same on every rank).
  __device__ int32_t schedule_warps() const { return params.comm_ctas_per_rank * kScheduleWarpsPerCta; }

  // Padded rows of this rank's schedule; valid after wait_schedule_filled.
  __device__ int32_t padded_rows() const {
    return __ldcg(&view().expert_offset[params.num_local_experts]);
  }
};

}  // namespace mok::device
