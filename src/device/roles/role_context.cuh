// What every role of the fused forward knows about itself: its rank's view,
// the world's parameters, the protocol backend, and the geometry of its
// rank's pass (known once the rank's schedule exists).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "device/kernel/fused_forward_params.hpp"
#include "device/ptx/named_barrier.cuh"
#include "protocol/pass_forward.hpp"
#include "protocol/device_sync.cuh"

namespace mok::device {

// Named barriers of the fused kernel (0 is __syncthreads).
enum NamedBarrier : int {
  kBarrierDispatch = 1,        // the copy warps of a dispatch CTA
  kBarrierFusedWeightGradClear = 2, // the consumer warpgroups of a GEMM CTA, around a weight-gradient tile's row clearing
};

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

// kTraining: the forward's training mode, which also keeps the gate/up
// pre-activations where the caller asks (gemm_consumer.cuh); a separate
// instantiation, so that the inference kernel's code is the same as without it.
// Params: the kernel's parameters (FusedForwardParams for the forward),
// which name the pass (Params::Pass) and hold every rank's view
// (Params::ranks[r]); the GEMM roles read only fields every pass's params
// and views share (docs/backward-design.md, "Implementation plan").
template <cuda::thread_scope kScope_, bool kTraining_ = false, class Params_ = FusedForwardParams>
struct RoleContext {
  static constexpr cuda::thread_scope kScope = kScope_;
  using Params = Params_;
  // The pass this kernel runs (its task table; src/protocol/pass_forward.hpp).
  using Pass = typename Params::Pass;
  using View = std::remove_cvref_t<decltype(std::declval<const Params&>().ranks[0])>;
  static constexpr bool kTraining = kTraining_;

  const Params& params;
  int32_t rank;
  protocol::DeviceSync<kScope> sync;

  __device__ const View& view() const { return params.ranks[rank]; }
  __device__ const protocol::PassCounters<Pass>& counters() const { return view().counters; }

  // The token tile is the table's (0, the m-tile, for a table whose kinds
  // share one tile height: every bf16 pass).
  __device__ protocol::PassShape shape() const {
    return protocol::PassShape{params.tile_m,       params.minibatch_rows, params.ring_slots,
                               params.lookahead,    params.hidden,         params.intermediate,
                               params.shared_width, params.num_local_experts, protocol::shape_token_tile_m<Pass>()};
  }
  // The pass's geometry for `padded_rows` schedule rows (0 before the schedule
  // exists: token-row tasks and every counter index do not need it).
  __device__ protocol::PassGeometry<Pass> geometry(int32_t padded_rows) const {
    return protocol::pass_geometry<Pass>(shape(), view().tokens, padded_rows);
  }

  // Warps that build a rank's schedule (the same on every rank).
  __device__ int32_t schedule_warps() const { return params.comm_ctas_per_rank * kScheduleWarpsPerCta; }

  // Padded rows of this rank's schedule; valid after wait_schedule_filled.
  __device__ int32_t padded_rows() const {
    return __ldcg(&view().expert_offset[params.num_local_experts]);
  }
};

}  // namespace mok::device
