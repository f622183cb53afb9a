// Thin wrappers for the Hopper warpgroup matrix instructions that CCCL's
// cuda::ptx does not cover: wgmma.mma_async (bf16 x bf16 -> fp32), its
// fence / commit / wait, the shared-memory matrix descriptor, and setmaxnreg.
//
// Every function here is warpgroup-collective (4 consecutive warps starting at
// a warp index divisible by 4 must all call it), except smem_desc_k_sw128.
//
// Operand convention used throughout mok: both operands K-major (A is
// [rows, K], B is [cols, K], as nn.Linear stores weights), staged in shared
// memory by TMA with the 128-byte swizzle, 64 bf16 (128 bytes) of K per row.
#pragma once

#include <cstdint>

namespace mok::device::wgmma {

// Shared-memory matrix descriptor for a K-major tile written by TMA with
// CU_TENSOR_MAP_SWIZZLE_128B: rows of 128 bytes, 8-row core groups 1024 bytes
// apart (stride byte offset), leading byte offset unused for this layout
// (encoded as 1, the value the PTX ISA documents as "assumed"). `smem` must
// lie in a 1024-byte aligned tile; stepping along K inside the 128-byte row
// is done by adding k_bytes / 16 to the returned value (see advance_k).
// Its high half is the same for every such tile: the stride byte offset
// (bits 32-45: 1024 / 16) and the swizzle mode (bits 62-63: 1 = 128-byte).
inline constexpr uint32_t kDescHighK128 = (1024u >> 4) | (1u << 30);
__device__ __forceinline__ uint64_t smem_desc_k_sw128(const void* smem) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((addr & 0x3FFFFu) >> 4);   // bits 0-13: start address / 16
  desc |= static_cast<uint64_t>(1) << 16;                  // bits 16-29: leading byte offset / 16
  desc |= static_cast<uint64_t>(kDescHighK128) << 32;      // the stride and the swizzle
  return desc;
}

// A descriptor (or any 64-bit value every lane of the warp holds alike),
// read from lane 0. Derived from a per-thread value (the ring's stage index),
// a stage's descriptors were each rebuilt with 64-bit address arithmetic
// before their wgmma (IMAD, IADD3). From the shuffled value they are the
// same value plus constant steps, which ptxas computes with far fewer
// instructions. It still moves each descriptor into the uniform registers
// wgmma reads (R2UR) before every wgmma. With m64n64k32 wgmma, 32 cycles of
// tensor work each, those instructions bound the issue rate
// (docs/perf-notes.md q10).
__device__ __forceinline__ uint64_t warp_uniform(uint64_t desc) { return __shfl_sync(0xffffffffu, desc, 0); }

// The descriptor of the same tile moved `k_elems` bf16 along K (inside one
// 64-element swizzle row: k_elems in {0, 16, 32, 48}).
__device__ __forceinline__ uint64_t advance_k(uint64_t desc, int k_elems) {
  return desc + static_cast<uint64_t>((k_elems * 2) >> 4);
}

// Shared-memory matrix descriptor for an MN-major tile written by TMA with
// CU_TENSOR_MAP_SWIZZLE_128B as blocks of [K rows][64 bf16 of MN] (one
// 128-byte row per k, 8-row groups 1024 bytes apart: the stride byte
// offset), the blocks `block_bytes` apart along MN (the leading byte offset:
// for MN-major swizzled layouts it steps from one 64-element MN block to the
// next). `smem` must lie in a 1024-byte aligned tile.
__device__ __forceinline__ uint64_t smem_desc_mn_sw128(const void* smem, uint32_t block_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((addr & 0x3FFFFu) >> 4);           // bits 0-13: start address / 16
  desc |= static_cast<uint64_t>((block_bytes & 0x3FFFFu) >> 4) << 16;  // bits 16-29: leading byte offset / 16
  desc |= static_cast<uint64_t>(1024 >> 4) << 32;                  // bits 32-45: stride byte offset / 16
  desc |= static_cast<uint64_t>(1) << 62;                          // bits 62-63: 1 = 128-byte swizzle
  return desc;
}

// The MN-major descriptor moved `k_elems` rows along K (whole 8-row groups:
// k_elems a multiple of 8): 128 bytes per row.
__device__ __forceinline__ uint64_t advance_k_mn(uint64_t desc, int k_elems) {
  return desc + static_cast<uint64_t>((k_elems * 128) >> 4);
}

// Orders this warpgroup's earlier register and shared-memory accesses before
// the wgmma that follow (wgmma.fence): required before the first wgmma of a
// sequence and whenever the accumulators were touched by ordinary code.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// Closes the wgmma issued since the last commit into one group.
__device__ __forceinline__ void commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_group() {
  static_assert(kPending >= 0 && kPending <= 7, "wgmma.wait_group takes 0..7");
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads or writes of an accumulator register
// across an asynchronous wgmma (the asm names the register as read+written).
template <int kCount>
__device__ __forceinline__ void fence_operands(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Register budget hand-off between warpgroups (needs a register cap at kernel
// entry: __launch_bounds__(threads, 1)).
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes 24..256 in steps of 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes 24..256 in steps of 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// wgmma.mma_async m64nNk16, bf16 inputs, fp32 accumulators, both operands
// K-major from shared memory (descriptors above). accumulate == 0 overwrites D
// (D = A*B^T), otherwise D += A*B^T. Accumulator layout (PTX "wgmma D
// fragment"): thread t of the warpgroup holds, for each 8-column chunk j,
// d[4j + 2h + e] = D[16*(t/32) + (t%32)/4 + 8h][8j + 2*(t%4) + e].
//
// Mok uses exactly one instruction shape per build for every tile, so a
// row's result never depends on the code path that computed it.
// D[64 x 256] (+)= A[64 x 16] * B[256 x 16]^T; 128 fp32 accumulators per thread.
// kTransB: 0 for a K-major B, 1 for an MN-major B (the instruction's
// imm-trans-b); kTransA likewise for A (imm-trans-a: a weight gradient reads
// its rows^T, M contiguous).
template <int kTransB = 0, int kTransA = 0>
__device__ __forceinline__ void mma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, uint32_t accumulate) {
  static_assert(kTransB == 0 || kTransB == 1);
  static_assert(kTransA == 0 || kTransA == 1);
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, %132, %131;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransB), "n"(kTransA));
}

// D[64 x 128] (+)= A[64 x 16] * B[128 x 16]^T; 64 fp32 accumulators per thread.
template <int kTransB = 0, int kTransA = 0>
__device__ __forceinline__ void mma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, uint32_t accumulate) {
  static_assert(kTransB == 0 || kTransB == 1);
  static_assert(kTransA == 0 || kTransA == 1);
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, %68, %67;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransB), "n"(kTransA));
}


}  // namespace mok::device::wgmma
