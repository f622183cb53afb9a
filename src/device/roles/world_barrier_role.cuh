// The world barrier in the fused kernels (forward and backward), for
// device-ordered passes (params.epoch != 0; protocol/world_barrier.hpp,
// docs/protocol.md). Two calls
// frame a rank's pass: world_start by every thread of every CTA before any
// role, world_finish by every warp once it has left its roles. With epoch 0
// (host-ordered passes: the host zeroed the counters) both do nothing.
#pragma once

#include <cstdint>

#include "device/ptx/async_copy.cuh"
#include "device/roles/role_context.cuh"
#include "protocol/world_barrier.hpp"

namespace mok::device {

// Barrier waits have their own bound: ranks of a process world start their
// passes whenever their hosts get there, which may be far apart.
template <class Ctx>
__device__ __forceinline__ protocol::DeviceSync<Ctx::kScope> barrier_sync(const Ctx& ctx) {
  return protocol::DeviceSync<Ctx::kScope>{ctx.params.barrier_timeout_ns};
}

// Words a counter set holds past the pass's counters (a pass's own cursors),
// which the end barrier clears with them: Params::kCounterSetTailWords
// where the params name some.
template <class Params>
constexpr size_t counter_set_tail_words() {
  if constexpr (requires { Params::kCounterSetTailWords; }) {
    return Params::kCounterSetTailWords;
  } else {
    return 0;
  }
}

// Every thread of a CTA of the rank (`cta` = its index within the rank).
// Returns false, for the whole CTA, if the barrier gave up: then no role may
// run (a peer's inputs may not be there), and the caller goes straight to
// world_finish.
template <class Ctx>
__device__ __forceinline__ bool world_start(Ctx& ctx, int cta) {
  if (ctx.params.epoch == 0) return true;
  bool ok = true;
  if (threadIdx.x == 0) {
    auto sync = barrier_sync(ctx);
    auto words = [&](int32_t q) { return ctx.params.ranks[q].barrier; };
    ok = protocol::start_world_pass(sync, words, *ctx.view().barrier, cta == 0, ctx.params.world_size, ctx.rank,
                                    ctx.params.epoch);
    // Peers' inputs are read by bulk copies and TMA (the async proxy) too.
    fence_proxy_async_global();
  }
  // The barrier orders every thread's later reads after thread 0's acquires.
  return __syncthreads_and(ok) != 0;
}

// Every warp of the rank, once (all 32 lanes), after its roles returned --
// finished or aborted -- or after world_start failed (`warps_per_cta` warps
// in each of the rank's CTAs). The last warp to arrive ends the pass for the
// rank: announces it to every rank, waits until all have finished, then
// zeroes the rank's other counter set for the next pass. It finds its rank
// from the block index again, so that nothing stays live across the roles
// for it (the GEMM consumers are at their register limit).
template <cuda::thread_scope kScope, class Params>
__device__ __forceinline__ void world_finish(const Params& params, int warps_per_cta) {
  if (params.epoch == 0) return;
  __syncwarp();  // the lanes' accesses come before lane 0's release
  const RoleContext<kScope, false, Params> ctx{
      params, params.first_rank + static_cast<int>(blockIdx.x) / params.ctas_per_rank, {params.barrier_timeout_ns}};
  const int lane = threadIdx.x % 32;
  auto sync = ctx.sync;
  protocol::WorldBarrierWords& mine = *ctx.view().barrier;
  bool last = false;
  if (lane == 0) last = protocol::arrive_pass_done(sync, mine, static_cast<uint32_t>(ctx.params.ctas_per_rank * warps_per_cta));
  last = __shfl_sync(0xffffffffu, last, 0);
  if (!last) return;
  bool ok = false;
  if (lane == 0) {
    auto words = [&](int32_t q) { return ctx.params.ranks[q].barrier; };
    ok = protocol::finish_world_pass(sync, words, mine, ctx.params.world_size, ctx.rank, ctx.params.epoch);
  }
  ok = __shfl_sync(0xffffffffu, ok, 0);
  __syncwarp();
  // If a peer never finished it may still use our counters: leave them (the
  // world is broken; the host reports it and refuses further passes).
  if (!ok) return;
  const size_t words = protocol::counter_words(ctx.geometry(0)) + counter_set_tail_words<Params>();
  protocol::clear_counter_set(sync, ctx.view().idle_counters, words, static_cast<uint32_t>(lane), 32u);
}

}  // namespace mok::device
