// What the GEMM consumers' barrier waits do when one never completes: end
// the kernel with a deliberate illegal-address fault, then sleep until the
// fault takes the kernel down.
//
// Why not trap, as every other barrier wait does (ptx/async_copy.cuh): a trap
// instruction anywhere in the code that runs after setmaxnreg.inc makes ptxas
// allocate all of that code within the kernel's entry budget (168 registers
// at 384 threads) instead of the raised one (232). With 128 accumulators
// live, the epilogue and the hand-off then spilled their addresses and loop
// state to local memory, and with shared memory taking almost all of the
// SM's L1, each reload was a trip to L2 on the path between two tasks. Nor
// `exit`: an exit on a path inside the mainloop makes ptxas serialise every
// wgmma (warning C7518). A store to address 0 followed by a sleep loop is
// ordinary code to ptxas (checked: no spills in the consumer loop, no C7518)
// and ends the launch with cudaErrorIllegalAddress, which the host reports.
// Nor returning to the caller: the four warps of a warpgroup (and the lanes
// that wait alone) would not agree on when to stop, and a partial warpgroup
// must not issue wgmma.
//
// In practice this never fires first: a consumer's barriers are completed by
// its own CTA's producer warpgroup, whose waits trap after 10 s (or give up
// on a counter within the pass's timeout and end the task list), while this
// one waits the pass's timeout plus 10 s. It is the backstop for a producer
// warpgroup that left while its consumers still wait.
#pragma once

#include <cstdint>

#include "device/ptx/async_copy.cuh"

namespace mok::device {

struct ConsumerFaultOnStall {
  uint64_t timeout_ns;

  __device__ explicit ConsumerFaultOnStall(uint64_t pass_timeout_ns)
      : timeout_ns(pass_timeout_ns + kBackstopWaitNs) {}

  __device__ void operator()() const {
    asm volatile("st.volatile.global.u32 [%0], 0;\n" ::"l"(uint64_t{0}) : "memory");
    for (;;) __nanosleep(1000);
  }
};

}  // namespace mok::device
