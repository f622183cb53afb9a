// The schedule, built inside the pass by the rank's dispatch CTAs: the device
// form of src/plan/schedule_rules.hpp (same rule: rows of each local expert in
// (home rank, token, slot) order, padded at the expert's end). It is checked
// through its results -- outputs against the CPU reference, which walks the
// host schedule, and bitwise equality across world sizes and SM splits.
//
// The world's routing entries, rank-major, are split into one contiguous
// chunk per schedule warp (W warps: every warp of the dispatch CTAs), so the
// work is spread over all of them whatever the number of experts:
//
//   1. count    each warp histograms its chunk's local experts (shared-memory
//               atomics) into hist[chunk][expert]; it also validates a share
//               of this rank's own entries (range, duplicates, finite
//               weights), so nothing is ever silently dropped or poisoned.
//                                                     -> schedule_counted (W)
//   2. scan     warp w, for its experts e = w, w + W, ...: exclusive scan of
//               hist[.][e] over the chunks, in place, and the expert's total.
//                                                     -> schedule_scanned (El)
//   3. fill     each warp: padded offsets from the totals (a warp scan), its
//               chunk's first row per expert = offset + scan, then one pass
//               over its chunk writing rows in entry order (match_any ranks
//               lanes that hit the same expert); the warp owning expert e also
//               writes e's padding rows, warp 0 the offsets.
//                                                     -> schedule_filled (W)
//
// Entry order inside a chunk, and chunks in order, is global (rank, token,
// slot) order: the result is the host rule's, independent of W.
#pragma once

#include <cstdint>

#include "device/roles/role_context.cuh"
#include "mok/row_source.hpp"

namespace mok::device {

// Local experts the in-kernel schedule supports (one shared-memory counter
// per expert per warp).
inline constexpr int kMaxScheduleExperts = 1024;
// Rounds of 32 routing entries whose loads a schedule warp issues together.
inline constexpr int kScheduleBatch = 4;

struct ScheduleShared {
  int32_t per_warp[kScheduleWarpsPerCta][kMaxScheduleExperts];
};

// This rank's own entries: every id in [0, E) and distinct within its token,
// every weight finite (a NaN or infinite weight would poison the token's
// output in the combine; the CPU path refuses it too).
// A round covers 32 / k whole tokens (lane = token * k + slot), and a warp
// issues kScheduleBatch rounds' loads together: validating is a stream of
// loads, not one memory latency per token.
template <class Ctx>
__device__ __forceinline__ bool validate_own_routing(Ctx& ctx, int warp, int warps) {
  const RankView& v = ctx.view();
  const int k = ctx.params.top_k;
  const int num_experts = ctx.params.num_local_experts * ctx.params.world_size;
  const int lane = threadIdx.x % 32;
  const int per_round = 32 / k;  // tokens per round (k <= 16)
  const int group = lane / k, slot = lane % k;
  const bool in_group = group < per_round;
  const int64_t entries = static_cast<int64_t>(v.tokens) * k;
  for (int t0 = warp * per_round * kScheduleBatch; t0 < v.tokens; t0 += warps * per_round * kScheduleBatch) {
    int32_t ids[kScheduleBatch];
    float weights[kScheduleBatch];
#pragma unroll
    for (int b = 0; b < kScheduleBatch; ++b) {
      const int64_t n = static_cast<int64_t>(t0 + b * per_round + group) * k + slot;
      ids[b] = in_group && n < entries ? __ldg(&v.ids[n]) : 0;
      weights[b] = in_group && n < entries ? __ldg(&v.weights[n]) : 0.f;
    }
#pragma unroll
    for (int b = 0; b < kScheduleBatch; ++b) {
      const int t = t0 + b * per_round + group;
      const bool real = in_group && t < v.tokens;
      const int32_t id = ids[b];
      bool bad = real && (id < 0 || id >= num_experts);
      for (int i = 0; i < k; ++i) {  // an earlier slot of the same token with the same id
        const int32_t other = __shfl_sync(0xffffffffu, id, (in_group ? group : 0) * k + i);
        if (real && i < slot && other == id) bad = true;
      }
      const uint32_t bad_lanes = __ballot_sync(0xffffffffu, bad);
      const uint32_t bad_weight_lanes = __ballot_sync(0xffffffffu, real && !isfinite(weights[b]));
      if ((bad_lanes | bad_weight_lanes) != 0) {
        // The first bad entry in entry order; a bad id wins over a bad weight
        // of the same entry.
        const int first = __ffs(bad_lanes | bad_weight_lanes) - 1;
        const bool bad_id = (bad_lanes >> first) & 1u;
        const uint32_t observed = bad_id ? static_cast<uint32_t>(__shfl_sync(0xffffffffu, id, first))
                                         : __float_as_uint(__shfl_sync(0xffffffffu, weights[b], first));
        const int bad_token = t0 + b * per_round + first / k;
        if (lane == 0) {
          protocol::report_bad_entry(ctx.sync, ctx.counters(),
                                     bad_id ? protocol::CounterId::kBadRouting : protocol::CounterId::kBadWeight,
                                     ctx.rank, bad_token * k + first % k, observed);
        }
        return false;
      }
    }
  }
  return true;
}

// Calls visit(home_rank, entry_index_on_that_rank, local_expert or -1) for the
// entries of chunk `chunk`, 32 at a time (every lane calls it each round, with
// entry -1 past the end), in global entry order.
template <class Ctx, class Visit>
__device__ __forceinline__ void for_each_chunk_entry(Ctx& ctx, int chunk, int chunks,
                                                     const Visit& visit) {
  const int lane = threadIdx.x % 32;
  const int k = ctx.params.top_k;
  const int32_t first_expert = ctx.rank * ctx.params.num_local_experts;
  int64_t total = 0;
  for (int r = 0; r < ctx.params.world_size; ++r) total += static_cast<int64_t>(ctx.params.ranks[r].tokens) * k;
  const int64_t per_chunk = ((total + chunks - 1) / chunks + 31) / 32 * 32;
  const int64_t begin = chunk * per_chunk;
  const int64_t end = begin + per_chunk < total ? begin + per_chunk : total;
  int64_t rank_begin = 0;
  for (int r = 0; r < ctx.params.world_size && rank_begin < end; ++r) {
    const RankView& home = ctx.params.ranks[r];
    const int64_t rank_end = rank_begin + static_cast<int64_t>(home.tokens) * k;
    const int64_t lo = begin > rank_begin ? begin : rank_begin;
    const int64_t hi = end < rank_end ? end : rank_end;
    // kScheduleBatch rounds of 32 entries per step: their loads are in
    // flight together (one memory latency per step), then visited in order.
    for (int64_t step = lo; step < hi; step += 32 * kScheduleBatch) {
      int32_t ids[kScheduleBatch];
#pragma unroll
      for (int b = 0; b < kScheduleBatch; ++b) {
        const int64_t n = step + 32 * b + lane;
        // ld.global.cg, not the read-only path: in a process world a peer's
        // staged ids are written by its stream while this kernel already
        // runs (before the start barrier), so they are not read-only for
        // the whole kernel.
        ids[b] = n < hi ? __ldcg(&home.ids[n - rank_begin]) : -1;
      }
#pragma unroll
      for (int b = 0; b < kScheduleBatch; ++b) {
        const int64_t n = step + 32 * b + lane;
        if (step + 32 * b >= hi) break;  // warp-uniform
        int32_t local = -1;
        if (n < hi) {
          local = ids[b] - first_expert;
          if (local < 0 || local >= ctx.params.num_local_experts) local = -1;
        }
        visit(r, n < hi ? n - rank_begin : int64_t{-1}, local);
      }
    }
    rank_begin = rank_end;
  }
}

// Run by every warp of the rank's dispatch CTAs (`warp` of `warps`); returns
// false if the pass aborts.
template <class Ctx>
__device__ __forceinline__ bool build_schedule(Ctx& ctx, ScheduleShared& smem, int warp,
                                               int warps) {
  const int lane = threadIdx.x % 32;
  const int El = ctx.params.num_local_experts;
  const int k = ctx.params.top_k;
  const int32_t tile_m = ctx.params.tile_m;
  const RankView& v = ctx.view();
  int32_t* mine = smem.per_warp[threadIdx.x / 32];
  int32_t* hist = v.schedule_hist;  // [warps][El]

  if (!validate_own_routing(ctx, warp, warps)) return false;

  // 1. count
  for (int e = lane; e < El; e += 32) mine[e] = 0;
  __syncwarp();
  for_each_chunk_entry(ctx, warp, warps, [&](int, int64_t, int32_t local) {
    if (local >= 0) atomicAdd(&mine[local], 1);
  });
  __syncwarp();
  for (int e = lane; e < El; e += 32) hist[static_cast<int64_t>(warp) * El + e] = mine[e];
  __syncwarp();
  bool ok = true;
  if (lane == 0) {
    protocol::signal_schedule_counted(ctx.sync, ctx.counters());
    ok = protocol::wait_schedule_counted(ctx.sync, ctx.counters(), warps, ctx.rank);
  }
  ok = __shfl_sync(0xffffffffu, ok, 0);
  __syncwarp();  // the other lanes' reads come after lane 0's acquire
  if (!ok) return false;

  // 2. scan: exclusive over chunks, 32 chunks per round.
  uint32_t scanned = 0;
  for (int e = warp; e < El; e += warps, ++scanned) {
    int32_t carry = 0;
    for (int c0 = 0; c0 < warps; c0 += 32) {
      const int c = c0 + lane;
      const int32_t count = c < warps ? __ldcg(&hist[static_cast<int64_t>(c) * El + e]) : 0;
      int32_t inclusive = count;
#pragma unroll
      for (int s = 1; s < 32; s <<= 1) {
        const int32_t up = __shfl_up_sync(0xffffffffu, inclusive, s);
        if (lane >= s) inclusive += up;
      }
      if (c < warps) hist[static_cast<int64_t>(c) * El + e] = carry + inclusive - count;
      carry += __shfl_sync(0xffffffffu, inclusive, 31);
    }
    if (lane == 0) v.expert_rows[e] = carry;
  }
  __syncwarp();
  if (lane == 0) {
    if (scanned > 0) protocol::signal_schedule_scanned(ctx.sync, ctx.counters(), scanned);
    ok = protocol::wait_schedule_scanned(ctx.sync, ctx.counters(), El, ctx.rank);
  }
  ok = __shfl_sync(0xffffffffu, ok, 0);
  __syncwarp();
  if (!ok) return false;

  // 3. fill. Padded offsets, 32 experts per round; mine[e] = this chunk's first row for e.
  int32_t offset = 0;
  for (int e0 = 0; e0 < El; e0 += 32) {
    const int e = e0 + lane;
    const int32_t rows = e < El ? __ldcg(&v.expert_rows[e]) : 0;
    const int32_t padded = (rows + tile_m - 1) / tile_m * tile_m;
    int32_t inclusive = padded;
#pragma unroll
    for (int s = 1; s < 32; s <<= 1) {
      const int32_t up = __shfl_up_sync(0xffffffffu, inclusive, s);
      if (lane >= s) inclusive += up;
    }
    const int32_t start = offset + inclusive - padded;
    if (e < El) {
      mine[e] = start + __ldcg(&hist[static_cast<int64_t>(warp) * El + e]);
      if (warp == 0) v.expert_offset[e] = start;
      if (e % warps == warp) {  // this warp owns expert e: its padding rows
        for (int32_t row = start + rows; row < start + padded; ++row) v.rows[row] = padding_row();
      }
    }
    offset += __shfl_sync(0xffffffffu, inclusive, 31);
  }
  if (warp == 0 && lane == 0) {
    v.expert_offset[El] = offset;
    *ctx.counters().schedule_rows = static_cast<uint32_t>(offset);  // for the peers (counters.hpp)
  }
  __syncwarp();
  for_each_chunk_entry(ctx, warp, warps, [&](int r, int64_t n, int32_t local) {
    // Lanes hitting the same expert take consecutive rows in lane order.
    const uint32_t peers = __match_any_sync(0xffffffffu, local);
    const uint32_t before = peers & ((1u << lane) - 1u);
    const int32_t cursor = local >= 0 ? mine[local] : 0;
    __syncwarp();  // every lane has read its cursor before any moves
    if (local >= 0) {
      v.rows[cursor + __popc(before)] = RowSource{r, static_cast<int32_t>(n / k), static_cast<int32_t>(n % k)};
      if (before == 0) mine[local] = cursor + __popc(peers);  // the group's first lane moves the cursor
    }
    __syncwarp();
  });
  __syncwarp();
  if (lane == 0) protocol::signal_schedule_filled(ctx.sync, ctx.counters());
  return true;
}

}  // namespace mok::device
