// The backward's pull dispatch (docs/backward-design.md): the rank's dispatch
// CTAs copy, for every row of the schedule its forward built, the row's dout
// and x out of its home rank into buffers that hold the whole schedule, and
// its routing weight into w_rows; then announce the m-tile (rows_filled).
// Dispatch CTA c owns m-tiles c, c + C, ... in increasing order, as in the
// forward (dispatch_role.cuh, whose copy loop this reuses). Nothing waits for
// a slot: the buffers never wrap. Padding rows are not copied: no task mixes
// rows, and a weight-gradient tile clears the rows past its expert's real
// rows in shared memory before it reads them. It also tells each row's home
// rank where the row's dx_j will be (dx_row_of), which its combine reads.
#pragma once

#include <cstdint>

#include "device/roles/dispatch_role.cuh"
#include "device/trace/trace_record.cuh"

namespace mok::device {

// All threads of a dispatch CTA; `cta` = its index among the rank's dispatch CTAs.
template <class Ctx>
__device__ __forceinline__ bool backward_dispatch(Ctx& ctx, DispatchShared& smem, int cta) {
  using Pass = typename Ctx::Pass;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= kCopyWarps) return true;  // the other warps go straight to the combine
  if (lane == 0) begin_copy_warp(smem, warp);
  const auto& v = ctx.view();
  const protocol::PassGeometry<Pass> g = ctx.geometry(ctx.padded_rows());
  // A schedule longer than the buffers (a forward of other token counts)
  // moves no row; the fetchers see it too and end their task lists.
  if (!protocol::require_schedule_fits(ctx.sync, v.counters, g, ctx.rank)) return false;
  const int64_t H = ctx.params.hidden;
  const int top_k = ctx.params.top_k;
  const uint32_t row_bytes = static_cast<uint32_t>(H) * 2u;
  uint32_t phases = 0;
  for (int32_t m_tile = cta; m_tile < g.m_tiles(); m_tile += ctx.params.comm_ctas_per_rank) {
    const TraceStamp copy_begin = trace_now();
    const int64_t row0 = static_cast<int64_t>(m_tile) * g.tile_m;
    const RowSource* tile_rows = v.rows + row0;
    // The tile's schedule entries into shared memory (dispatch_role.cuh); the
    // previous tile's copies and reads of them ended at its barrier.
    stage_tile_sources(smem, tile_rows, g.tile_m, static_cast<int>(threadIdx.x), kCopyWarps * 32);
    named_barrier_sync(kBarrierDispatch, kCopyWarps * 32);
    if (lane == 0) {
      copy_rows(
          smem, warp, phases, g.tile_m, row_bytes,
          [&](const RowSource& src) { return ctx.params.ranks[src.rank].dout + static_cast<int64_t>(src.token) * H; },
          [&](int32_t i) { return v.dout_rows + (row0 + i) * H; });
      copy_rows(
          smem, warp, phases, g.tile_m, row_bytes,
          [&](const RowSource& src) { return ctx.params.ranks[src.rank].x + static_cast<int64_t>(src.token) * H; },
          [&](int32_t i) { return v.x_rows + (row0 + i) * H; });
    }
    // The routing weight of each real row (the g epilogue's row scale), and
    // where its dx_j will lie, for the home rank's combine (ordered before
    // the combine's reads by rows_filled -> d13_ready -> dx_done).
    for (int32_t i = warp * 32 + lane; i < g.tile_m; i += kCopyWarps * 32) {
      const RowSource src = smem.tile_sources[i];
      if (!is_padding(src)) {
        const int64_t home_slot = static_cast<int64_t>(src.token) * top_k + src.slot;
        const auto& home = ctx.params.ranks[src.rank];
        v.w_rows[row0 + i] = __ldcg(&home.weights[home_slot]);
        home.dx_row_of[home_slot] = DxRowOf{ctx.rank, static_cast<int32_t>(row0 + i)};
      }
    }
    named_barrier_sync(kBarrierDispatch, kCopyWarps * 32);
    if (threadIdx.x == 0) {
      // The rows are read by TMA (async proxy), the weights by generic loads.
      fence_proxy_async_global();
      protocol::signal_outputs<typename Pass::Dispatch>(ctx.sync, v.counters, g, m_tile / g.tiles_per_minibatch(),
                                                        m_tile);
      trace_record(ctx.params, TraceKind::kDispatchCopy, m_tile, ctx.rank, copy_begin, trace_now());
    }
  }
  return true;
}

}  // namespace mok::device
