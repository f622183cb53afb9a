// A CTA-level barrier over a subset of its warps (bar.sync with an id and a
// thread count). Id 0 is __syncthreads; each kernel names the ids it uses.
#pragma once

namespace mok::device {

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace mok::device
