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
  kBarrierFusedExchange = 3,   // the consumer warpgroups of a GEMM CTA, handing a split-N tile's halves over (FP8)
  kBarrierDispatchRows = 4,    // 4 .. 7: a copy warp and its quantizing helpers in the FP8 dispatch (per copy warp)
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
// Pass_: the table, when it is not the params' own (the FP8 forward runs
// ForwardFp8Pass over FusedForwardParams: the same counters, the same views;
// only its tiles and its ring contents differ).
template <cuda::thread_scope kScope_, bool kTraining_ = false, class Params_ = FusedForwardParams,
          class Pass_ = typename Params_::Pass>
struct RoleContext {
  static constexpr cuda::thread_scope kScope = kScope_;
  using Params = Params_;
  // The pass this kernel runs (its task table; src/protocol/pass_forward.hpp).
  using Pass = Pass_;
  using View = std::remove_cvref_t<decltype(std::declval<const Params&>().ranks[0])>;
  static constexpr bool kTraining = kTraining_;

  const Params& params;
  int32_t rank;
  protocol::DeviceSync<kScope> sync;

  __device__ const View& view() const { return params.ranks[rank]; }
  // A rank's counters as this pass's table names them. The view holds them as
  // its params' pass does; another table over the same views must have the
  // same counters (same number, spans and signalling), so the two types are
  // the same pointers (static_assert below).
  __device__ const protocol::PassCounters<Pass>& counters_of(int32_t r) const {
    using Held = std::remove_cvref_t<decltype(params.ranks[0].counters)>;
    if constexpr (std::is_same_v<Held, protocol::PassCounters<Pass>>) {
      return params.ranks[r].counters;
    } else {
      static_assert(same_counters<typename Params::Pass, Pass>(), "a table over these views needs their counters");
      return *reinterpret_cast<const protocol::PassCounters<Pass>*>(&params.ranks[r].counters);
    }
  }
  __device__ const protocol::PassCounters<Pass>& counters() const { return counters_of(rank); }

  template <class A, class B>
  static constexpr bool same_counters() {
    if (A::kNumCounters != B::kNumCounters) return false;
    for (int i = 0; i < A::kNumCounters; ++i) {
      if (A::kCounters[i].span != B::kCounters[i].span ||
          A::kCounters[i].stores_generation != B::kCounters[i].stores_generation ||
          A::kCounters[i].report_id != B::kCounters[i].report_id) {
        return false;
      }
    }
    return sizeof(protocol::PassCounters<A>) == sizeof(protocol::PassCounters<B>);
  }

  // The token tile is the table's (0, the m-tile, for a table whose kinds
  // share one tile height: every bf16 pass).
  __device__ protocol::PassShape shape() const {
    return protocol::PassShape{params.tile_m,       params.minibatch_rows, params.ring_slots,
                               params.lookahead,    params.hidden,         params.intermediate,
                               params.shared_width, params.num_local_experts, protocol::shape_token_tile_m<Pass>(),
                               params.n_major_kinds};
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
