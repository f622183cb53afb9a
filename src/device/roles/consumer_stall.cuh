// What the GEMM consumers do when one of their CTA's barriers never
// completes: record it in the pass's stall report and exit the thread.
//
// Why not trap, as every other barrier wait does (ptx/async_copy.cuh): a trap
// instruction anywhere in the code that runs after setmaxnreg.inc makes ptxas
// allocate all of that code within the kernel's entry budget (168 registers
// at 384 threads) instead of the raised one (232). With 128 accumulators
// live, the epilogue and the hand-off then spilled their addresses and loop
// state to local memory, and with shared memory taking almost all of the
// SM's L1, each reload was a trip to L2 on the path between two tasks.
//
// A consumer's barriers are completed by its own CTA's producer warpgroup,
// whose waits on other SMs time out first (they use the pass's timeout; this
// one adds 10 s), record the real stall and abort the pass. So this report
// only ever names a broken CTA, and the host turns it into an error.
#pragma once

#include <cstdint>

#include "device/roles/role_context.cuh"

namespace mok::device {

template <cuda::thread_scope kScope>
struct ConsumerExitOnStall {
  RoleContext<kScope>* ctx;
  uint64_t timeout_ns;

  __device__ explicit ConsumerExitOnStall(RoleContext<kScope>& c)
      : ctx(&c), timeout_ns(c.params.timeout_ns + 10ull * 1000 * 1000 * 1000) {}

  __device__ void operator()() const {
    protocol::record_stall(ctx->sync, ctx->counters(), protocol::CounterId::kGemmBarrier, ctx->rank, ctx->rank,
                           static_cast<int32_t>(blockIdx.x), 0u, 0u);
    asm volatile("exit;\n" ::: "memory");
  }
};

}  // namespace mok::device
