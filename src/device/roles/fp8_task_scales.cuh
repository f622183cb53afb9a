// Where a task of the fused FP8 forward finds its operands' scales
// (protocol/pass_forward_fp8.hpp, gemm/fp8_stage_scales.cuh): A's come with
// each stage (the producer's copy from the ring's scale arrays); B's, the
// weights', are staged per task into shared memory by the row-resolver warp
// (gemm_row_resolver.cuh) before its rows_ready arrival, which the consumers
// wait for before their K loop (gemm_consumer_mixed.cuh).
#pragma once

#include <cstdint>

#include "device/gemm/fp8_mainloop.cuh"
#include "device/roles/gemm_role.cuh"

namespace mok::device {

// The scales of a FP8 kind's operands in its rank: B's, of the rank's
// experts' weights. A's rows are ring rows (x for gate/up, h for down), whose
// scales the producer copies into the stages (gemm_producer.cuh,
// ring_scale_copy): the consumers read them there, never from the ring.
template <class Spec, class Ctx>
__device__ __forceinline__ Fp8Scales fp8_scales_of(const Ctx& ctx) {
  const Fp8RankOperands& q = ctx.params.fp8[ctx.rank];
  const protocol::PassShape s = ctx.shape();
  const int32_t k = protocol::dim_of(s, Spec::value.k);
  Fp8Scales f;
  f.k_blocks = k / 128;
  f.a = nullptr;
  f.m_total = ctx.params.ring_slots * ctx.params.minibatch_rows;
  if constexpr (Spec::value.a == protocol::Tensor::kRingX) {
    static_assert(Spec::value.b == protocol::Tensor::kW13);
    f.b = q.w13_scales;
    f.n_blocks = 2 * s.intermediate / 128;
    f.up_rows = s.intermediate;
  } else {
    static_assert(Spec::value.a == protocol::Tensor::kRingH && Spec::value.b == protocol::Tensor::kW2);
    f.b = q.w2_scales;
    f.n_blocks = s.hidden / 128;
    f.up_rows = 0;
  }
  return f;
}

// The task's tile as the FP8 mainloop sees it.
template <class Cfg>
__device__ __forceinline__ GemmTile fp8_tile_of(const GemmTask& task) {
  GemmTile tile;
  tile.group = task.expert;
  tile.row0 = task.row0;
  tile.row_end = task.row0 + task.real_rows;
  tile.n0 = task.n_tile * Cfg::kOutCols;
  return tile;
}

// The row resolver's share (its whole warp): the B scales of the task in
// `slot`, when its kind runs the FP8 mainloop, into the slot's table. A
// pass with no FP8 kind compiles this to nothing.
template <class Ctx>
__device__ __forceinline__ void stage_fp8_task_b_scales(const Ctx& ctx, FusedGemmShared& smem, const GemmTask& task,
                                                        int slot, int lane) {
  using Pass = typename Ctx::Pass;
  protocol::visit_kind<Pass>(task.kind, [&](auto K) {
    using Spec = protocol::KindSpec<Pass, protocol::index_of<decltype(K)>>;
    using Cfg = KindConfig<Spec>;
    if constexpr (Cfg::kElement == ElementType::kE4M3) {
      const Fp8Scales scales = fp8_scales_of<Spec>(ctx);
      const Fp8BScaleRows rows = fp8_wide_b_scale_rows<Cfg>(scales, fp8_tile_of<Cfg>(task));
      stage_tile_b_scales(smem.b_scales[slot], scales.b, rows.half0, rows.half1, scales.k_blocks, lane);
    }
  });
}

}  // namespace mok::device
