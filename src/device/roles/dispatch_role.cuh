// Pull dispatch: the rank's dispatch CTAs copy the scheduled rows out of their
// home ranks' x into the local ring, one m-tile at a time, with bulk copies
// (global -> shared -> global; a few KB each). Dispatch CTA c owns m-tiles
// c, c + C, ... in increasing order (the order the deadlock argument of
// docs/protocol.md needs). Inside a CTA, kCopyWarps warps split the tile's
// rows; each warp's lane 0 drives a pipeline of kSlotsPerWarp shared-memory
// row buffers. Padding rows are not copied: their ring rows keep stale data,
// which only ever reaches padding rows of h and y (rows never mix).
//
// A tile's schedule entries (RowSource: where each row comes from) are
// staged into shared memory by all of the CTA's copying threads at once
// before its rows are copied (stage_tile_sources). Read from L2 one row at a
// time inside the copy loop, each read sat on the loop's critical path:
// staged, a CTA copies about twice the rows on layers of width 2048
// (docs/perf-notes.md v7).
#pragma once

#include <cstdint>
#include <type_traits>

#include "device/ptx/async_copy.cuh"
#include "device/ptx/bulk_copy.cuh"
#include "device/ptx/vector_io.cuh"
#include "device/quant/e4m3.cuh"
#include "device/roles/role_context.cuh"
#include "device/trace/trace_record.cuh"
#include "protocol/pass_forward_fp8.hpp"
#include "protocol/ring_scales.hpp"

namespace mok::device {

inline constexpr int kCopyWarps = 4;
inline constexpr int kSlotsPerWarp = 3;
inline constexpr uint32_t kCopySlotBytes = 16384;  // one row of up to H = 8192 bf16

// FP8 forward: the ue8m0 scales of one m-tile's rows, [128-column block][row
// of the tile], gathered here while the rows are quantized and stored to the
// ring's k-block-major scale array afterwards, a block's bytes for the whole
// tile at once (protocol/ring_scales.hpp). Stored a byte at a time from each
// row, they landed a pitch apart, one partial sector each.
inline constexpr int kMaxScaleBlocks = kCopySlotBytes / 2 / 128;  // H <= 8192
inline constexpr int kMaxDispatchTileRows = 128;
static_assert(protocol::kinds_block_m<protocol::ForwardFp8Pass>(protocol::Rows::kSchedule) <= kMaxDispatchTileRows &&
                  protocol::kinds_block_m<protocol::ForwardFp8Pass>(protocol::Rows::kSchedule) % 16 == 0,
              "an FP8 m-tile's gathered scales fit tile_scales, in whole 16-byte chunks");

struct DispatchShared {
  alignas(128) uint8_t slots[kCopyWarps][kSlotsPerWarp][kCopySlotBytes];
  uint64_t full[kCopyWarps][kSlotsPerWarp];
  alignas(16) uint8_t tile_scales[kMaxScaleBlocks][kMaxDispatchTileRows];
  RowSource tile_sources[kMaxDispatchTileRows];  // the m-tile's schedule entries (stage_tile_sources)
};

// Every one of `threads` threads (`thread` its index among them): the
// m-tile's schedule entries into smem.tile_sources, all read from L2 at once.
// The caller synchronises those threads before the copy reads them, and
// after the copy before the next tile's staging overwrites them.
__device__ __forceinline__ void stage_tile_sources(DispatchShared& smem, const RowSource* tile_rows, int32_t tile_m,
                                                   int thread, int threads) {
  for (int32_t i = thread; i < tile_m; i += threads) smem.tile_sources[i] = load_row_source(&tile_rows[i]);
}

// Lane 0 of a copy warp: copies this warp's share of an m-tile's real rows
// (rows copy_warp, copy_warp + kCopyWarps, ... of the tile; their schedule
// entries staged in smem.tile_sources) from from(RowSource) to to(row within
// the tile), row_bytes each, through its shared-memory slots, and waits
// until the writes are complete.
template <class From, class To>
__device__ __forceinline__ void copy_rows(DispatchShared& smem, int copy_warp, uint32_t& phases, int32_t tile_m,
                                          uint32_t row_bytes, const From& from, const To& to) {
  int issued = 0, stored = 0;
  int32_t pending_row[kSlotsPerWarp];
  auto next_real_row = [&](int32_t start) {
    for (int32_t i = start; i < tile_m; i += kCopyWarps) {
      if (!is_padding(smem.tile_sources[i])) return i;
    }
    return tile_m;
  };
  int32_t cursor = next_real_row(copy_warp);
  auto issue = [&](int32_t i) {
    const int slot = issued % kSlotsPerWarp;
    mbarrier_arrive_expect_tx(&smem.full[copy_warp][slot], row_bytes);
    bulk_load(smem.slots[copy_warp][slot], from(smem.tile_sources[i]), row_bytes, &smem.full[copy_warp][slot]);
    pending_row[slot] = i;
    ++issued;
  };
  // Prologue: all but one slot in flight.
  while (cursor < tile_m && issued < kSlotsPerWarp - 1) {
    issue(cursor);
    cursor = next_real_row(cursor + kCopyWarps);
  }
  while (stored < issued) {
    const int slot = stored % kSlotsPerWarp;
    mbarrier_wait_parity(&smem.full[copy_warp][slot], (phases >> slot) & 1u);
    phases ^= 1u << slot;
    bulk_store(to(pending_row[slot]), smem.slots[copy_warp][slot], row_bytes);
    bulk_commit();
    ++stored;
    if (cursor < tile_m) {
      // The next load reuses the slot of store `issued - kSlotsPerWarp`: the
      // one before the newest store, so at most one store may still read.
      if (issued >= kSlotsPerWarp) bulk_wait_read<1>();
      issue(cursor);
      cursor = next_real_row(cursor + kCopyWarps);
    }
  }
  bulk_wait_all();  // writes complete before the tile is announced
}

// Lane 0 of copy warp `warp`, before its first copy_rows.
__device__ __forceinline__ void begin_copy_warp(DispatchShared& smem, int warp) {
  for (int s = 0; s < kSlotsPerWarp; ++s) mbarrier_init(&smem.full[warp][s], 1);
  fence_barrier_init();
  // This lane issues bulk copies (async proxy) of peers' rows, written by
  // their streams before their passes started (ordered by the world
  // barrier's acquire or the stream order, generic-proxy operations).
  fence_proxy_async_global();
}

// Lane 0 of copy warp `warp`, after its last copy_rows (its copies are
// complete), before the CTA's shared memory holds anything else.
__device__ __forceinline__ void end_copy_warp(DispatchShared& smem, int warp) {
  for (int s = 0; s < kSlotsPerWarp; ++s) mbarrier_inval(&smem.full[warp][s]);
}

// Whether a pass's rings hold block-scaled FP8 rows (the FP8 forward's table
// says so): its dispatch quantizes the rows it pulls.
template <class Pass>
constexpr bool fp8_rings() {
  if constexpr (requires { Pass::kFp8Rings; }) {
    return Pass::kFp8Rings;
  } else {
    return false;
  }
}

// Warps that quantize a copy warp's rows in the FP8 forward: the copy warp
// and two helpers (warps copy_warp + kCopyWarps, + 2 kCopyWarps of the
// dispatch CTA, which otherwise wait idle for the combine). Quantizing is
// what bounds the FP8 dispatch, not the bytes (docs/perf-notes.md q5).
inline constexpr int kFp8QuantizeParts = 3;
static_assert(kCopyWarps * kFp8QuantizeParts <= kScheduleWarpsPerCta, "the helpers are warps of the dispatch CTA");

// The FP8 forward's copy, by the copy warp and its helpers (`part` 0 is the
// copy warp, 1.. its helpers): the copy warp's rows of the m-tile pulled by
// bulk copies into its shared-memory slots (as copy_rows does,
// kSlotsPerWarp rows in flight: a row's latency is hidden only by many bytes
// in flight), then quantized from there by all lanes of the kFp8QuantizeParts
// warps, each a contiguous share of the row's 512-column steps -- e4m3 bytes
// and one ue8m0 scale per 128 columns (quant/e4m3.cuh: the rule the host
// quantizer and the CPU reference apply, so a row's bytes depend only on the
// row) -- and stored to the ring with plain stores, which the caller fences
// toward the gate/up tasks' TMA and bulk-copy reads (the scales go
// k-block-major, protocol/ring_scales.hpp: a row's scale bytes land a pitch
// apart, so that a tile's rows at one k-block are one copy into a GEMM
// stage). Every part walks the same rows and slots (the same schedule
// reads), so their slot phases agree; a slot is refilled once every part is
// through it (named barrier kBarrierDispatchRows + copy_warp).
template <class Ctx, class Geometry>
__device__ __forceinline__ void copy_x_rows_fp8(Ctx& ctx, DispatchShared& smem, int copy_warp, int part,
                                                uint32_t& phases, const Geometry& g, int32_t m_tile) {
  const auto& v = ctx.view();
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t H = ctx.params.hidden;
  const uint32_t row_bytes = static_cast<uint32_t>(H) * 2u;
  const int64_t ring_row0 = protocol::ring_row_of_tile(g, m_tile);
  uint8_t* const values = reinterpret_cast<uint8_t*>(v.ring_x);
  const int32_t tile_m = g.tile_m;
  auto next_real_row = [&](int32_t start) {
    for (int32_t i = start; i < tile_m; i += kCopyWarps) {
      if (!is_padding(smem.tile_sources[i])) return i;
    }
    return tile_m;
  };
  int issued = 0, done = 0;
  int32_t pending_row[kSlotsPerWarp];
  auto issue = [&](int32_t i) {
    const int slot = issued % kSlotsPerWarp;
    if (part == 0 && lane == 0) {
      const RowSource src = smem.tile_sources[i];
      mbarrier_arrive_expect_tx(&smem.full[copy_warp][slot], row_bytes);
      bulk_load(smem.slots[copy_warp][slot], ctx.params.ranks[src.rank].x + static_cast<int64_t>(src.token) * H,
                row_bytes, &smem.full[copy_warp][slot]);
    }
    pending_row[slot] = i;
    ++issued;
  };
  int32_t cursor = next_real_row(copy_warp);
  while (cursor < tile_m && issued < kSlotsPerWarp) {
    issue(cursor);
    cursor = next_real_row(cursor + kCopyWarps);
  }
  while (done < issued) {
    const int slot = done % kSlotsPerWarp;
    mbarrier_wait_parity(&smem.full[copy_warp][slot], (phases >> slot) & 1u);
    phases ^= 1u << slot;
    const int64_t row = ring_row0 + pending_row[slot];
    const uint32_t base = shared_address(smem.slots[copy_warp][slot]);
    uint8_t* const row_values = values + row * H;
    uint8_t* const row_scales = &smem.tile_scales[0][pending_row[slot]];  // block b's byte at b * kMaxDispatchTileRows
    // Wide steps of 512 columns, four 128-column blocks a step, a
    // quarter-warp each (sixteen values a lane: quantize_quarter_block_*),
    // kSteps steps at once: a step is a chain of dependent latencies (shared
    // loads, a 3-deep shuffle reduction, conversions, a store), and one at a
    // time left the dispatch latency-bound (docs/perf-notes.md q5). Sixteen
    // values a lane rather than eight halve the shuffles and the scale
    // arithmetic per value: the quantizing warps are bound by the
    // instructions they issue (64 a 256-column step and warp with eight
    // values a lane, perf-notes v26). H is a multiple of 256: a 256-column
    // rest, if any, goes to part 0 in the half-warp form.
    constexpr int kSteps = 4;
    const int64_t wide_steps = H / 512;
    const int64_t first = wide_steps * part / kFp8QuantizeParts;
    const int64_t last = wide_steps * (part + 1) / kFp8QuantizeParts;
    // In phases across the steps (loads, lane maxima, the three shuffle
    // rounds interleaved, then bytes and stores), so that the steps' latency
    // chains overlap; the scale rule has no branch to split them
    // (quant/scale_exponent_rule.hpp).
    auto quantize_wide_steps = [&](int64_t w0, auto count) {
      constexpr int kCount = decltype(count)::value;
      uint4 lo[kCount], hi[kCount];
      float amax[kCount];
#pragma unroll
      for (int i = 0; i < kCount; ++i) {
        const uint32_t at = base + static_cast<uint32_t>(w0 + i) * 1024u + lane * 32u;
        lo[i] = ld_shared_v4(at);
        hi[i] = ld_shared_v4(at + 16u);
      }
#pragma unroll
      for (int i = 0; i < kCount; ++i) amax[i] = quarter_block_lane_amax(lo[i], hi[i]);
      quarter_block_amax_reduce(amax);
#pragma unroll
      for (int i = 0; i < kCount; ++i) {
        uint8_t scale;
        const uint4 q = quantize_quarter_block_with_amax(lo[i], hi[i], amax[i], scale);
        *reinterpret_cast<uint4*>(row_values + (w0 + i) * 512 + lane * 16) = q;
        if (lane % 8 == 0) row_scales[(4 * (w0 + i) + lane / 8) * kMaxDispatchTileRows] = scale;
      }
    };
    int64_t w = first;
    for (; w + kSteps <= last; w += kSteps) quantize_wide_steps(w, std::integral_constant<int, kSteps>{});
    for (; w < last; ++w) quantize_wide_steps(w, std::integral_constant<int, 1>{});
    if (part == 0 && H % 512 != 0) {
      // The last 256 columns: two blocks, a half-warp each.
      const int64_t b = H / 256 - 1;  // in 256-column steps
      const uint4 raw = ld_shared_v4(base + static_cast<uint32_t>(b) * 512u + lane * 16u);
      float amax[1] = {half_block_lane_amax(raw)};
      half_block_amax_reduce(amax);
      uint8_t scale;
      const uint2 q = quantize_half_block_with_amax(raw, amax[0], scale);
      *reinterpret_cast<uint2*>(row_values + b * 256 + lane * 8) = q;
      if (lane % 16 == 0) row_scales[(2 * b + lane / 16) * kMaxDispatchTileRows] = scale;
    }
    ++done;
    if (cursor < tile_m) {
      // Every part's reads of the slot precede its refill (async proxy).
      named_barrier_sync(kBarrierDispatchRows + copy_warp, kFp8QuantizeParts * 32);
      if (part == 0 && lane == 0) fence_proxy_async_shared();
      issue(cursor);
      cursor = next_real_row(cursor + kCopyWarps);
    }
  }
}

// FP8 forward, every thread of the dispatch's `threads`, after every row of
// m-tile `m_tile` was quantized (copy_x_rows_fp8): the tile's gathered
// scales to the ring's scale array, each 128-column block's bytes for the
// tile's rows in 16-byte stores (the tile's first ring row is a multiple of
// its rows, and the pitch of 16). Padding rows' bytes are stale, as their
// values are: they reach only padding rows.
template <class Ctx, class Geometry>
__device__ __forceinline__ void store_tile_scales(Ctx& ctx, const DispatchShared& smem, const Geometry& g,
                                                  int32_t m_tile, int thread, int threads) {
  uint8_t* const scales = ctx.params.fp8[ctx.rank].ring_x_scales;
  const int64_t pitch =
      protocol::ring_scale_pitch(static_cast<int64_t>(ctx.params.ring_slots) * ctx.params.minibatch_rows);
  const int64_t ring_row0 = protocol::ring_row_of_tile(g, m_tile);
  const int chunks_per_block = g.tile_m / 16;
  const int chunks = static_cast<int>(ctx.params.hidden / 128) * chunks_per_block;
  for (int c = thread; c < chunks; c += threads) {
    const int block = c / chunks_per_block, chunk = c % chunks_per_block;
    const uint4 bytes = ld_shared_v4(shared_address(&smem.tile_scales[block][chunk * 16]));
    st_global_v4(scales + protocol::ring_scale_index(ring_row0 + chunk * 16, block, pitch), bytes);
  }
}

// The forward's copy: x rows of the home ranks into the ring.
template <class Ctx>
__device__ __forceinline__ void copy_x_rows(Ctx& ctx, DispatchShared& smem, int copy_warp, uint32_t& phases,
                                            const protocol::ForwardGeometry& g, int32_t m_tile) {
  const RankView& v = ctx.view();
  const int64_t H = ctx.params.hidden;
  uint16_t* const ring_rows = v.ring_x + static_cast<int64_t>(protocol::ring_row_of_tile(g, m_tile)) * H;
  copy_rows(
      smem, copy_warp, phases, g.tile_m, static_cast<uint32_t>(H) * 2u,
      [&](const RowSource& src) { return ctx.params.ranks[src.rank].x + static_cast<int64_t>(src.token) * H; },
      [&](int32_t i) { return ring_rows + static_cast<int64_t>(i) * H; });
}

// All threads of a dispatch CTA; `cta` = its index among the rank's dispatch CTAs.
template <class Ctx>
__device__ __forceinline__ bool dispatch(Ctx& ctx, DispatchShared& smem, int cta) {
  using Pass = typename Ctx::Pass;
  // The copy warps, and in the FP8 forward their quantizing helpers; the
  // other warps go straight to the combine.
  constexpr int kWarps = fp8_rings<Pass>() ? kCopyWarps * kFp8QuantizeParts : kCopyWarps;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= kWarps) return true;
  if (lane == 0 && warp < kCopyWarps) begin_copy_warp(smem, warp);
  bool ok = true;
  if (threadIdx.x == 0) {
    ok = protocol::wait_schedule_filled(ctx.sync, ctx.counters(), ctx.schedule_warps(), ctx.rank);
  }
  __shared__ int32_t shared_padded, shared_flag;
  if (threadIdx.x == 0) shared_padded = ok ? ctx.padded_rows() : -1;
  named_barrier_sync(kBarrierDispatch, kWarps * 32);
  const int32_t padded = shared_padded;
  if (padded < 0) return false;
  const auto g = ctx.geometry(padded);

  uint32_t phases = 0;
  const int ctas = ctx.params.comm_ctas_per_rank;
  for (int32_t m_tile = cta; m_tile < g.m_tiles(); m_tile += ctas) {
    const TraceStamp wait_begin = trace_now();
    TraceStamp copy_begin{0, 0};
    // The tile's schedule entries, while thread 0 waits for its ring slot
    // (the previous tile's copy is over: every copying thread passed the
    // barrier before its announce).
    stage_tile_sources(smem, ctx.view().rows + static_cast<int64_t>(m_tile) * g.tile_m, g.tile_m,
                       static_cast<int>(threadIdx.x), kWarps * 32);
    if (threadIdx.x == 0) {
      if constexpr (fp8_rings<Pass>()) {
        ok = protocol::wait_inputs<typename Pass::Dispatch>(ctx.sync, ctx.counters(), g,
                                                             m_tile / g.tiles_per_minibatch(), m_tile, ctx.rank);
      } else {
        ok = protocol::wait_ring_free(ctx.sync, ctx.counters(), g, m_tile, ctx.rank);
      }
      shared_flag = ok ? 1 : -1;
      copy_begin = trace_now();
      trace_record(ctx.params, TraceKind::kDispatchWait, m_tile, ctx.rank, wait_begin, copy_begin);
      // Earlier TMA reads of this slot (async proxy) are ordered before our writes.
      fence_proxy_async_global();
    }
    named_barrier_sync(kBarrierDispatch, kWarps * 32);
    if (shared_flag < 0) return false;
    if constexpr (fp8_rings<Pass>()) {
      copy_x_rows_fp8(ctx, smem, warp % kCopyWarps, warp / kCopyWarps, phases, g, m_tile);
      // Every row's scales are gathered: out with whole 16-byte stores.
      named_barrier_sync(kBarrierDispatch, kWarps * 32);
      store_tile_scales(ctx, smem, g, m_tile, static_cast<int>(threadIdx.x), kWarps * 32);
      // Every lane stored (generic proxy); the gate/up tasks read by TMA and bulk copies.
      fence_proxy_async_global();
    } else {
      if (lane == 0) copy_x_rows(ctx, smem, warp, phases, g, m_tile);
    }
    named_barrier_sync(kBarrierDispatch, kWarps * 32);
    if (threadIdx.x == 0) {
      fence_proxy_async_global();
      if constexpr (fp8_rings<Pass>()) {
        protocol::signal_outputs<typename Pass::Dispatch>(ctx.sync, ctx.counters(), g, m_tile / g.tiles_per_minibatch(),
                                                          m_tile);
      } else {
        protocol::signal_tile_filled(ctx.sync, ctx.counters(), g, m_tile);
      }
      trace_record(ctx.params, TraceKind::kDispatchCopy, m_tile, ctx.rank, copy_begin, trace_now());
    }
  }
  return true;
}

}  // namespace mok::device
