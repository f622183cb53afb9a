// Pull dispatch: the rank's dispatch CTAs copy the scheduled rows out of their
// home ranks' x into the local ring, one m-tile at a time, with bulk copies
// (global -> shared -> global; a few KB each). Dispatch CTA c owns m-tiles
// c, c + C, ... in increasing order (the order the deadlock argument of
// docs/protocol.md needs). Inside a CTA, kCopyWarps warps split the tile's
// rows; each warp's lane 0 drives a pipeline of kSlotsPerWarp shared-memory
// row buffers. Padding rows are not copied: their ring rows keep stale data,
// which only ever reaches padding rows of h and y (rows never mix).
#pragma once

#include <cstdint>

#include "device/ptx/async_copy.cuh"
#include "device/ptx/bulk_copy.cuh"
#include "device/roles/role_context.cuh"
#include "device/trace/trace_record.cuh"

namespace mok::device {

inline constexpr int kCopyWarps = 4;
inline constexpr int kSlotsPerWarp = 3;
inline constexpr uint32_t kCopySlotBytes = 16384;  // one row of up to H = 8192 bf16

struct DispatchShared {
  alignas(128) uint8_t slots[kCopyWarps][kSlotsPerWarp][kCopySlotBytes];
  uint64_t full[kCopyWarps][kSlotsPerWarp];
};

// Lane 0 of a copy warp: copy `count` rows (by schedule row index) into the ring.
template <class Ctx>
__device__ __forceinline__ void copy_rows(Ctx& ctx, DispatchShared& smem, int copy_warp,
                                          uint32_t& phases, const protocol::ForwardGeometry& g,
                                          int32_t m_tile) {
  const RankView& v = ctx.view();
  const uint32_t row_bytes = static_cast<uint32_t>(ctx.params.hidden) * 2u;
  const int32_t ring_row0 = protocol::ring_row_of_tile(g, m_tile);
  // Rows of this warp in the tile: copy_warp, copy_warp + kCopyWarps, ...
  int issued = 0, stored = 0;
  int32_t pending_row[kSlotsPerWarp];
  auto next_real_row = [&](int32_t from) {
    for (int32_t i = from; i < g.tile_m; i += kCopyWarps) {
      if (!is_padding(load_row_source(&v.rows[static_cast<int64_t>(m_tile) * g.tile_m + i]))) return i;
    }
    return g.tile_m;
  };
  int32_t cursor = next_real_row(copy_warp);
  auto issue = [&](int32_t i) {
    const int slot = issued % kSlotsPerWarp;
    const RowSource src = load_row_source(&v.rows[static_cast<int64_t>(m_tile) * g.tile_m + i]);
    const uint16_t* from = ctx.params.ranks[src.rank].x + static_cast<int64_t>(src.token) * ctx.params.hidden;
    mbarrier_arrive_expect_tx(&smem.full[copy_warp][slot], row_bytes);
    bulk_load(smem.slots[copy_warp][slot], from, row_bytes, &smem.full[copy_warp][slot]);
    pending_row[slot] = i;
    ++issued;
  };
  // Prologue: all but one slot in flight.
  while (cursor < g.tile_m && issued < kSlotsPerWarp - 1) {
    issue(cursor);
    cursor = next_real_row(cursor + kCopyWarps);
  }
  while (stored < issued) {
    const int slot = stored % kSlotsPerWarp;
    mbarrier_wait_parity(&smem.full[copy_warp][slot], (phases >> slot) & 1u);
    phases ^= 1u << slot;
    uint16_t* to = v.ring_x + static_cast<int64_t>(ring_row0 + pending_row[slot]) * ctx.params.hidden;
    bulk_store(to, smem.slots[copy_warp][slot], row_bytes);
    bulk_commit();
    ++stored;
    if (cursor < g.tile_m) {
      // The next load reuses the slot of store `issued - kSlotsPerWarp`: the
      // one before the newest store, so at most one store may still read.
      if (issued >= kSlotsPerWarp) bulk_wait_read<1>();
      issue(cursor);
      cursor = next_real_row(cursor + kCopyWarps);
    }
  }
  bulk_wait_all();  // writes complete before the tile is announced
}

// All threads of a dispatch CTA; `cta` = its index among the rank's dispatch CTAs.
template <class Ctx>
__device__ __forceinline__ bool dispatch(Ctx& ctx, DispatchShared& smem, int cta) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= kCopyWarps) return true;  // the other warps go straight to the combine
  if (lane == 0) {
    for (int s = 0; s < kSlotsPerWarp; ++s) mbarrier_init(&smem.full[warp][s], 1);
    fence_barrier_init();
    // This lane issues bulk copies (async proxy) of peers' x, written by
    // their streams before their passes started (ordered by the world
    // barrier's acquire, a generic-proxy operation).
    fence_proxy_async_global();
  }
  bool ok = true;
  if (threadIdx.x == 0) {
    ok = protocol::wait_schedule_filled(ctx.sync, ctx.counters(), ctx.schedule_warps(), ctx.rank);
  }
  __shared__ int32_t shared_padded, shared_flag;
  if (threadIdx.x == 0) shared_padded = ok ? ctx.padded_rows() : -1;
  named_barrier_sync(kBarrierDispatch, kCopyWarps * 32);
  const int32_t padded = shared_padded;
  if (padded < 0) return false;
  const protocol::ForwardGeometry g = ctx.geometry(padded);

  uint32_t phases = 0;
  const int ctas = ctx.params.comm_ctas_per_rank;
  for (int32_t m_tile = cta; m_tile < g.m_tiles(); m_tile += ctas) {
    const TraceStamp wait_begin = trace_now();
    TraceStamp copy_begin{0, 0};
    if (threadIdx.x == 0) {
      ok = protocol::wait_ring_free(ctx.sync, ctx.counters(), g, m_tile, ctx.rank);
      shared_flag = ok ? 1 : -1;
      copy_begin = trace_now();
      trace_record(ctx.params, TraceKind::kDispatchWait, m_tile, ctx.rank, wait_begin, copy_begin);
      // Earlier TMA reads of this slot (async proxy) are ordered before our writes.
      fence_proxy_async_global();
    }
    named_barrier_sync(kBarrierDispatch, kCopyWarps * 32);
    if (shared_flag < 0) return false;
    if (lane == 0) copy_rows(ctx, smem, warp, phases, g, m_tile);
    named_barrier_sync(kBarrierDispatch, kCopyWarps * 32);
    if (threadIdx.x == 0) {
      fence_proxy_async_global();
      protocol::signal_tile_filled(ctx.sync, ctx.counters(), g, m_tile);
      trace_record(ctx.params, TraceKind::kDispatchCopy, m_tile, ctx.rank, copy_begin, trace_now());
    }
  }
  return true;
}

}  // namespace mok::device
