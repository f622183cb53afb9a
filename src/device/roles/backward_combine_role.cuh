// The backward's combine on each token's home rank, run by every warp of the
// rank once its own role is done (docs/backward-design.md):
//   dx[t] = bf16( 0 + dx_shared[t] + dx_0[t] + ... + dx_{k-1}[t] )   fp32, slots in order
//   dweights[t][j] = part_0 + part_1 + ...                          the n-tile parts, in n-tile order
// The same arithmetic as the staged backward's row_combine and row-parts
// kernels, so the two give the same bits. It first waits for the rank's
// shared expert and for every owner's dx tasks (polling the owners' own
// counters; the owner's schedule length is in its pass state).
#pragma once

#include <cstdint>

#include "device/kernel/bf16x8.cuh"
#include "device/roles/combine_role.cuh"
#include "device/roles/role_context.cuh"

namespace mok::device {

template <class Ctx>
__device__ __forceinline__ bool backward_combine(Ctx& ctx, int warp, int warps) {
  using Pass = typename Ctx::Pass;
  const int lane = threadIdx.x % 32;
  const auto& v = ctx.view();
  bool ok = true;
  if (lane == 0) {
    constexpr protocol::CounterWait shared_done = Pass::Combine::value.waits[0];
    constexpr protocol::CounterWait dx_done = Pass::Combine::value.waits[1];
    ok = protocol::wait_counter(ctx.sync, v.counters.abort_view(), v.counters, ctx.geometry(0), shared_done, 0, 0,
                                ctx.rank, ctx.rank);
    for (int owner = 0; ok && owner < ctx.params.world_size; ++owner) {
      const auto& o = ctx.params.ranks[owner];
      Ctx owner_ctx{ctx.params, owner, ctx.sync};
      const int32_t padded = __ldcg(&o.expert_offset[ctx.params.num_local_experts]);
      ok = protocol::wait_counter(ctx.sync, v.counters.abort_view(), o.counters, owner_ctx.geometry(padded), dx_done,
                                  0, 0, ctx.rank, owner);
    }
  }
  ok = __shfl_sync(0xffffffffu, ok, 0);
  __syncwarp();  // orders the other lanes' reads after lane 0's acquires
  if (!ok) return false;

  const int k = ctx.params.top_k;
  const int64_t H = ctx.params.hidden;
  const bool has_shared = ctx.params.shared_width > 0;
  const int parts = (ctx.params.intermediate + PassGemmCfg<Pass>::kOutCols - 1) / PassGemmCfg<Pass>::kOutCols;
  for (int t = warp; t < v.tokens; t += warps) {
    const uint16_t* slots = v.combine + static_cast<int64_t>(t) * k * H;
    for (int64_t c = lane * 8; c < H; c += 32 * 8) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (has_shared) add_bf16x8(acc, __ldcg(reinterpret_cast<const uint4*>(v.shared_dx + t * H + c)));
      // Every slot's load in flight before the first addition.
      uint4 raw[kMaxTopK];
#pragma unroll
      for (int j = 0; j < kMaxTopK; ++j) {
        if (j < k) raw[j] = __ldcg(reinterpret_cast<const uint4*>(slots + j * H + c));
      }
#pragma unroll
      for (int j = 0; j < kMaxTopK; ++j) {
        if (j < k) add_bf16x8(acc, raw[j]);
      }
      *reinterpret_cast<uint4*>(v.dx + t * H + c) = pack_bf16x8(acc);
    }
    if (lane < k) {
      const float* p = v.dw_parts + (static_cast<int64_t>(t) * k + lane) * parts;
      float sum = __ldcg(p);
      for (int i = 1; i < parts; ++i) sum = __fadd_rn(sum, __ldcg(p + i));
      v.dweights[static_cast<int64_t>(t) * k + lane] = sum;
    }
  }
  return true;
}

}  // namespace mok::device
