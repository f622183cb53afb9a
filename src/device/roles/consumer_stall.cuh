// What the GEMM consumers do when one of their CTA's barriers never
// completes: record it in the pass's stall report, stop waiting, and leave
// the task loop (the host turns the report into an error).
//
// Why not trap, as every other barrier wait does (ptx/async_copy.cuh): a trap
// instruction anywhere in the code that runs after setmaxnreg.inc makes ptxas
// allocate all of that code within the kernel's entry budget (168 registers
// at 384 threads) instead of the raised one (232). With 128 accumulators
// live, the epilogue and the hand-off then spilled their addresses and loop
// state to local memory, and with shared memory taking almost all of the
// SM's L1, each reload was a trip to L2 on the path between two tasks. Nor
// exit the thread: an exit on a path inside the mainloop makes ptxas
// serialise every wgmma (warning C7518). So the wait returns, later waits
// return at once (gave_up), wgmma may run over stale stages, and the
// consumer checks gave_up() before it stores anything or takes a new task.
//
// A consumer's barriers are completed by its own CTA's producer warpgroup,
// whose waits time out first (the pass's timeout for counters, 10 s for its
// barriers, which trap; this one is the pass's timeout plus 10 s), so in
// practice the trap ends the kernel before this policy fires.
//
// Known flaw (review): giving up is decided per thread, so the warps of a
// warpgroup, and lane 0 in its lone done_empty waits, need not agree on when
// to stop; a partial warpgroup must not issue wgmma. Branch
// fix/consumer-stall replaces this with a deliberate fault (built, SASS
// checked, not yet run on a GPU).
#pragma once

#include <cstdint>

#include "device/roles/role_context.cuh"

namespace mok::device {

template <cuda::thread_scope kScope>
struct ConsumerGiveUpOnStall {
  RoleContext<kScope>* ctx;
  uint64_t timeout_ns;
  mutable bool stalled = false;

  __device__ explicit ConsumerGiveUpOnStall(RoleContext<kScope>& c)
      : ctx(&c), timeout_ns(c.params.timeout_ns + 10ull * 1000 * 1000 * 1000) {}

  __device__ bool gave_up() const { return stalled; }

  __device__ void operator()() const {
    protocol::record_stall(ctx->sync, ctx->counters(), protocol::CounterId::kGemmBarrier, ctx->rank, ctx->rank,
                           static_cast<int32_t>(blockIdx.x), 0u, 0u);
    stalled = true;
  }
};

}  // namespace mok::device
