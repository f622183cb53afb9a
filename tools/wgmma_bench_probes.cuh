// mok_wgmma_bench's probes: the wide FP8 loop's structure (fp8_mainloop.cuh,
// mma_fp8_wide_tile: column steps through two partial sums taking turns, a
// wait_group<1> after each step's issue, a wait_group<0> and the next
// stage's wait at the stage boundary) with its promotion swapped, and the
// e4m3 wgmma shapes no kernel of mok's uses. Probes of where the loop's
// cycles go, not arithmetic anyone should use.
#pragma once

#include <cstdint>

#include "device/gemm/fp8_mainloop.cuh"

namespace mok::tools {

using namespace mok::device;

// How a probe promotes a step's partial sum into the accumulators.
enum class Promotion {
  kNone,             // not at all: the steps accumulate instead of overwriting, so every wgmma stays live
  kHalf,             // the first half of the step's FFMA only
  kAdd,              // FADD: two register reads, not three
  kSleep,            // all FFMA, in runs of eight split by a nanosleep
  kImmediate,        // FFMA with an immediate scale: two register reads
  kRowsAlternating,  // FFMA with the thread's two rows' scales alternating every two registers (the kernel's order)
  kRowsInRuns,       // the same products, each row's in one run (the reuse cache can serve the scale)
};

// D[64 x 256] (+)= A[64 x 32] * B[256 x 32]^T, e4m3 -> fp32 (no kernel of
// mok's uses it: its accumulators and a promotion partial exceed the
// registers).
__device__ __forceinline__ void mma_m64n256k32_e4m3(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                   uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
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
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D[64 x 32] (+)= A[64 x 32] * B[32 x 32]^T, e4m3 -> fp32, 16 accumulators a
// thread (the probe-eighths pattern only).
__device__ __forceinline__ void mma_m64n32k32_e4m3(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                  uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The probe loop: each stage's 256 B rows in 256 / kCols steps of kCols
// (m64n{kCols}k32 x 4 each), through two kCols / 2-register partials taking
// turns; step s + 1's wgmma run while step s is promoted into acc[s * kCols
// / 2 ..]. kCols 64: the wide tile's quarters; 32: eighths. `scale_top`,
// `scale_low`: the thread's two rows' scales (per thread, as the kernel's).
template <int kCols, Promotion kMode, class Cfg>
__device__ __forceinline__ void stepped_probe(GemmSharedStorage<Cfg>& smem, StageRing<Cfg::kStages>& ring,
                                              int consumer, float (&acc)[128], int k_blocks, float scale_top,
                                              float scale_low) {
  static_assert(kCols == 64 || kCols == 32, "m64n64k32 quarters or m64n32k32 eighths");
  constexpr int kSteps = 256 / kCols;
  constexpr int kRegs = kCols / 2;
  const bool releaser = threadIdx.x % 32 == 0;
  float part_even[kRegs], part_odd[kRegs];
  start_promotions(part_even);
  start_promotions(part_odd);
  start_promotions(acc);
  auto issue = [&](float(&part)[kRegs], uint64_t a, uint64_t b) {
    wgmma::fence_operands(part);
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint64_t ak = wgmma::advance_k_bytes(a, 32 * k), bk = wgmma::advance_k_bytes(b, 32 * k);
      const uint32_t accumulate = (kMode == Promotion::kNone || k > 0) ? 1u : 0u;
      if constexpr (kCols == 64) {
        wgmma::mma_m64n64k32_e4m3_sw128_lo(part, static_cast<uint32_t>(ak), static_cast<uint32_t>(bk), accumulate);
      } else {
        mma_m64n32k32_e4m3(part, ak, bk, accumulate);
      }
    }
    wgmma::commit_group();
  };
  // d[4j + 2h + e]: row half h, so the row's scale changes every two registers.
  auto promote = [&](float(&part)[kRegs], int step) {
    float* const to = acc + kRegs * step;
    wgmma::fence_operands(part);
    if constexpr (kMode == Promotion::kHalf) {
#pragma unroll
      for (int i = 0; i < kRegs / 2; ++i) to[i] = __fmaf_rn(part[i], scale_top, to[i]);
    } else if constexpr (kMode == Promotion::kAdd) {
#pragma unroll
      for (int i = 0; i < kRegs; ++i) to[i] = __fadd_rn(part[i], to[i]);
    } else if constexpr (kMode == Promotion::kSleep) {
#pragma unroll
      for (int i = 0; i < kRegs; ++i) {
        to[i] = __fmaf_rn(part[i], scale_top, to[i]);
        if (i % 8 == 7 && i < kRegs - 1) __nanosleep(0);
      }
    } else if constexpr (kMode == Promotion::kImmediate) {
#pragma unroll
      for (int i = 0; i < kRegs; ++i) to[i] = __fmaf_rn(part[i], 0.5f, to[i]);
    } else if constexpr (kMode == Promotion::kRowsAlternating) {
#pragma unroll
      for (int i = 0; i < kRegs; ++i) to[i] = __fmaf_rn(part[i], ((i / 2) % 2) ? scale_low : scale_top, to[i]);
    } else if constexpr (kMode == Promotion::kRowsInRuns) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < kRegs / 4; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int i = 4 * j + 2 * h + e;
            to[i] = __fmaf_rn(part[i], h ? scale_low : scale_top, to[i]);
          }
        }
      }
    }
  };
  auto take = [&]() {
    ring.consumer_wait();
    const int held = ring.stage;
    ring.advance();
    return held;
  };
  constexpr uint64_t kStep = (kCols * Cfg::kRowBytes) >> 4;  // kCols rows of B, in descriptor units
  int held = take();
  uint64_t a = wgmma::warp_uniform(wgmma::smem_desc_k_sw128(smem.stages[held].a + consumer * 64 * Cfg::kRowBytes));
  uint64_t b = wgmma::warp_uniform(wgmma::smem_desc_k_sw128(smem.stages[held].b));
  issue(part_even, a, b);
  int kb = 0;
  while (true) {
#pragma unroll
    for (int s = 1; s < kSteps; s += 2) {
      issue(part_odd, a, b + s * kStep);
      wgmma::wait_group<1>();
      promote(part_even, s - 1);
      if (s + 1 < kSteps) {
        issue(part_even, a, b + (s + 1) * kStep);
        wgmma::wait_group<1>();
        promote(part_odd, s);
      }
    }
    wgmma::wait_group<0>();
    if (releaser) ring.consumer_release(held);
    if (kb + 1 >= k_blocks) break;
    held = take();
    a = wgmma::warp_uniform(wgmma::smem_desc_k_sw128(smem.stages[held].a + consumer * 64 * Cfg::kRowBytes));
    b = wgmma::warp_uniform(wgmma::smem_desc_k_sw128(smem.stages[held].b));
    issue(part_even, a, b);
    promote(part_odd, kSteps - 1);
    ++kb;
  }
  promote(part_odd, kSteps - 1);
  if constexpr (kMode == Promotion::kNone) {
    wgmma::fence_operands(part_even);
#pragma unroll
    for (int i = 0; i < kRegs; ++i) acc[i] = part_even[i] + part_odd[i];
  }
}

}  // namespace mok::tools
