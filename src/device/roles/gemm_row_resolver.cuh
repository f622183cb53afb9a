// The GEMM CTA's row-resolver warp (gemm_role.cuh).
#pragma once

#include <cstdint>

#include "device/roles/fp8_task_scales.cuh"
#include "device/roles/gemm_role.cuh"

namespace mok::device {

// The row resolver (one warp of the producer warpgroup): for each task the
// producer posts whose rows go to home ranks (the forward's down tasks),
// looks up where each of its rows goes -- the home rank's row of that
// (token, slot) -- while the consumers run the mainloop, so their epilogue
// does not wait on those loads; and for each task of the FP8 forward's
// routed kinds, stages the tile's B scales into the slot's table, which the
// consumers read from their K loop's first stage on (fp8_task_scales.cuh).
// Every task gets a rows_ready arrival, so the consumers' phases stay in
// step. The producer posts a task when it starts loading its stages, a
// ring's depth ahead of the consumers, so neither wait finds it late but at
// a pass's first tasks.
template <class Ctx>
__device__ __forceinline__ void gemm_row_resolver(Ctx& ctx, FusedGemmShared& smem) {
  using Pass = typename Ctx::Pass;
  const auto& v = ctx.view();
  const int lane = threadIdx.x % 32;
  const int top_k = ctx.params.top_k;
  const protocol::PassShape shape = ctx.shape();
  SlotCursor<kTaskSlots> at;
  for (;;) {
    const int slot = at.slot;
    mbarrier_wait_parity(&smem.task_full[slot], at.phase);
    const GemmTask task = smem.tasks[slot];
    if (task.kind == protocol::kNoTask) return;
    // Home rows are [T * k, n] on the home rank, one per (token, slot). (A
    // pass without such kinds, the backward, only arrives.)
    if constexpr (home_rows_per_task<Pass>() > 0) {
      const int64_t width = home_row_width<Pass>(task.kind, shape);
      if (width > 0) {
        const RowSource* rows = v.rows + static_cast<int64_t>(task.m_tile) * ctx.params.tile_m;
        static_assert(home_rows_per_task<Pass>() <= FusedGemmCfg::kBlockM, "row_destination holds a tile's rows");
        for (int i = lane; i < home_rows_per_task<Pass>(); i += 32) {
          const RowSource src = load_row_source(&rows[i]);
          smem.row_destination[slot][i] =
              is_padding(src)
                  ? nullptr
                  : ctx.params.ranks[src.rank].combine + (static_cast<int64_t>(src.token) * top_k + src.slot) * width;
        }
      }
    }
    stage_fp8_task_b_scales(ctx, smem, task, slot, lane);
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&smem.rows_ready[slot]);
    at.advance();
  }
}

}  // namespace mok::device
