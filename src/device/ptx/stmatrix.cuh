// stmatrix (sm_90): a warp stores four 8x8 bf16 matrices from registers to
// shared memory; ldmatrix loads them back. cuda::ptx has no form of either,
// hence inline asm.
//
// Register k of thread t holds row t/4, columns 2*(t%4) and 2*(t%4)+1 of
// matrix k (the same fragment layout as a wgmma accumulator's 8x8 chunk);
// thread t gives the shared address of row t%8 of matrix t/8. Both take the
// same layout, so ldmatrix_x4 from the addresses a stmatrix_x4 used returns
// the registers it stored.
#pragma once

#include <cstdint>

namespace mok::device {

// `addr`: the shared-window address of this thread's row (shared_address()).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// volatile + "memory": stays in program order with the shared stores and
// __syncwarp that stage what it reads.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

}  // namespace mok::device
