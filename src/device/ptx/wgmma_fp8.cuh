// wgmma.mma_async for e4m3 x e4m3 -> fp32 (the FP8 GEMMs): m64n128k32 and
// m64n64k32, both operands K-major from shared memory (FP8 wgmma has no
// transposed operand), described as in wgmma.cuh (128-byte swizzle: 128 e4m3
// of K per row).
// Warpgroup-collective. Accumulator layout as for bf16 (wgmma.cuh):
// d[4j + 2h + e] = D[16 * (t / 32) + (t % 32) / 4 + 8h][8j + 2 (t % 4) + e].
#pragma once

#include <cstdint>

#include "device/ptx/wgmma.cuh"

namespace mok::device::wgmma {

// The descriptor moved `k_bytes` along K inside one 128-byte swizzle row.
__device__ __forceinline__ uint64_t advance_k_bytes(uint64_t desc, int k_bytes) {
  return desc + static_cast<uint64_t>(k_bytes >> 4);
}

// D[64 x 128] (+)= A[64 x 32] * B[128 x 32]^T; 64 fp32 accumulators per thread.
__device__ __forceinline__ void mma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                   uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D[64 x 64] (+)= A[64 x 32] * B[64 x 32]^T; 32 fp32 accumulators per thread
// (the wide FP8 tile's quarter partial sums, fp8_mainloop.cuh). Both
// operands are K-major 128-byte-swizzled tiles (smem_desc_k_sw128), given
// by their descriptors' low 32 bits (start address and leading byte offset);
// the instruction's own mov puts in the constant high half, kDescHighK128.
// This spares the 64-bit address arithmetic before each wgmma; ptxas still
// builds the 64-bit pair and moves it to uniform registers every time
// (docs/perf-notes.md q10). Another layout's descriptor cannot be passed
// (the 64-bit form is deleted).
__device__ __forceinline__ void mma_m64n64k32_e4m3_sw128_lo(float (&d)[32], uint32_t desc_a_lo, uint32_t desc_b_lo,
                                                           uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "mov.b64 da, {%32, %35};\n"
      "mov.b64 db, {%33, %35};\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, da, db, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(desc_a_lo), "r"(desc_b_lo), "r"(accumulate), "n"(kDescHighK128));
}

__device__ void mma_m64n64k32_e4m3_sw128_lo(float (&)[32], uint64_t, uint64_t, uint32_t) = delete;

}  // namespace mok::device::wgmma
