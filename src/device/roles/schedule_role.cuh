// The schedule, built inside the pass by the rank's dispatch CTAs: the device
// form of src/plan/schedule_rules.hpp (same rule: rows of each local expert in
// (home rank, token) order, padded at the expert's end). It is checked through
// its results -- outputs against the CPU reference, which walks the host
// schedule, and bitwise equality across world sizes -- not yet row by row.
// Warp w of the W dispatch warps owns local experts w, w + W, ...
//
//   1. count: the expert's rows over every rank's routing (ballot over 32
//      entries at a time, in global order); also validate this rank's own
//      entries (range, duplicates) so nothing is ever silently dropped;
//   2. after every expert is counted: the expert's padded offset, then its
//      rows in (home rank, token) order -- a ballot prefix keeps the order --
//      and the padding rows at its end.
#pragma once

#include <cstdint>

#include "device/roles/role_context.cuh"
#include "mok/row_source.hpp"

namespace mok::device {

// This rank's own entries: every id in [0, E) and distinct within its token.
template <cuda::thread_scope kScope>
__device__ __forceinline__ bool validate_own_routing(RoleContext<kScope>& ctx, int warp, int warps) {
  const RankView& v = ctx.view();
  const int k = ctx.params.top_k;
  const int num_experts = ctx.params.num_local_experts * ctx.params.world_size;
  const int lane = threadIdx.x % 32;
  for (int t = warp; t < v.tokens; t += warps) {
    const int32_t id = lane < k ? __ldg(&v.ids[static_cast<int64_t>(t) * k + lane]) : -1;
    bool bad = lane < k && (id < 0 || id >= num_experts);
    for (int i = 0; i < k; ++i) {
      const int32_t other = __shfl_sync(0xffffffffu, id, i);
      if (lane < k && i < lane && other == id) bad = true;
    }
    const uint32_t bad_lanes = __ballot_sync(0xffffffffu, bad);
    if (bad_lanes != 0) {
      const int first = __ffs(bad_lanes) - 1;
      const int32_t bad_id = __shfl_sync(0xffffffffu, id, first);
      if (lane == 0) protocol::report_bad_routing(ctx.sync, ctx.counters(), ctx.rank, t * k + first, bad_id);
      return false;
    }
  }
  return true;
}

template <cuda::thread_scope kScope>
__device__ __forceinline__ int32_t count_expert_rows(RoleContext<kScope>& ctx, int32_t expert) {
  const int lane = threadIdx.x % 32;
  int32_t count = 0;
  for (int r = 0; r < ctx.params.world_size; ++r) {
    const RankView& home = ctx.params.ranks[r];
    const int64_t entries = static_cast<int64_t>(home.tokens) * ctx.params.top_k;
    for (int64_t base = 0; base < entries; base += 32) {
      const int64_t n = base + lane;
      const bool hit = n < entries && __ldg(&home.ids[n]) == expert;
      count += __popc(__ballot_sync(0xffffffffu, hit));
    }
  }
  return count;
}

template <cuda::thread_scope kScope>
__device__ __forceinline__ void fill_expert_rows(RoleContext<kScope>& ctx, int32_t expert, int32_t offset,
                                                 int32_t count) {
  const int lane = threadIdx.x % 32;
  const int k = ctx.params.top_k;
  RowSource* rows = ctx.view().rows;
  int32_t cursor = offset;
  for (int r = 0; r < ctx.params.world_size; ++r) {
    const RankView& home = ctx.params.ranks[r];
    const int64_t entries = static_cast<int64_t>(home.tokens) * k;
    for (int64_t base = 0; base < entries; base += 32) {
      const int64_t n = base + lane;
      const bool hit = n < entries && __ldg(&home.ids[n]) == expert;
      const uint32_t hits = __ballot_sync(0xffffffffu, hit);
      if (hit) {
        const int32_t row = cursor + __popc(hits & ((1u << lane) - 1u));
        rows[row] = RowSource{r, static_cast<int32_t>(n / k), static_cast<int32_t>(n % k)};
      }
      cursor += __popc(hits);
    }
  }
  const int32_t padded_end = offset + (count + ctx.params.tile_m - 1) / ctx.params.tile_m * ctx.params.tile_m;
  for (int32_t row = offset + count + lane; row < padded_end; row += 32) rows[row] = padding_row();
}

// Run by every warp of the rank's dispatch CTAs; returns false if the pass aborts.
template <cuda::thread_scope kScope>
__device__ __forceinline__ bool build_schedule(RoleContext<kScope>& ctx, int warp, int warps) {
  const int lane = threadIdx.x % 32;
  const int num_local = ctx.params.num_local_experts;
  const int32_t first_expert = ctx.rank * num_local;
  const RankView& v = ctx.view();

  if (!validate_own_routing(ctx, warp, warps)) return false;
  for (int e = warp; e < num_local; e += warps) {
    const int32_t count = count_expert_rows(ctx, first_expert + e);
    if (lane == 0) {
      v.expert_rows[e] = count;
      protocol::signal_schedule_counted(ctx.sync, ctx.counters());
    }
  }
  // Lane 0 waits and broadcasts the outcome.
  bool ok = true;
  if (lane == 0) ok = protocol::wait_schedule_counted(ctx.sync, ctx.counters(), num_local, ctx.rank);
  ok = __shfl_sync(0xffffffffu, ok, 0);
  __syncwarp();  // orders the other lanes' reads after lane 0's acquire
  if (!ok) return false;

  const int32_t tile_m = ctx.params.tile_m;
  for (int e = warp; e < num_local; e += warps) {
    int32_t before = 0;  // padded rows of the experts before e
    for (int i = lane; i < e; i += 32) before += (__ldcg(&v.expert_rows[i]) + tile_m - 1) / tile_m * tile_m;
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) before += __shfl_xor_sync(0xffffffffu, before, s);
    const int32_t count = __ldcg(&v.expert_rows[e]);
    if (lane == 0) {
      v.expert_offset[e] = before;
      if (e == num_local - 1) v.expert_offset[num_local] = before + (count + tile_m - 1) / tile_m * tile_m;
    }
    fill_expert_rows(ctx, first_expert + e, before, count);
    __syncwarp();
    if (lane == 0) protocol::signal_schedule_filled(ctx.sync, ctx.counters());
  }
  return true;
}

}  // namespace mok::device
