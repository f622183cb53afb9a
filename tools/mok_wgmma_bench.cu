// mok_wgmma_bench: the tensor-core issue patterns of mok's K loops, timed in
// SM cycles without the memory traffic of a real loop. Each CTA (one per SM) runs one long K
// loop over four resident shared-memory stages (48 KB each: a 128-row A box
// and a 256-row B box, as the 128 x 256 tiles load), with the stage ring's
// barriers but no TMA: a producer thread announces each stage with zero
// bytes. So a pattern's cycles per stage are what its instructions, waits
// and tensor work cost alone, against 1,024 cycles of tensor work a stage
// (128 x 256 x 64 bf16 or 128 x 256 x 128 e4m3 MACs at the SM's dense rate).
// A kernel's K loop that takes longer than its pattern here loses the rest to
// memory (the TMA's writes, L2, the stage waits).
//
//   mok_wgmma_bench [--stages N] [--reps R] [--one-warpgroup] [--feed]
//
// --one-warpgroup: warpgroup 1 only forwards the stages, so each pattern's
// cycles are one warpgroup's (512 cycles of tensor work a stage).
// --feed: each stage's 48 KB is brought by bulk copies from an L2-resident
// buffer, so the loop also pays a real loop's shared-memory writes.
// Without either, a second table follows: the weight gradient's short-K
// tiles, their drain and their epilogue (wgmma_bench_weight_grad.cu).
//
// Patterns (two consumer warpgroups, 64 rows each, unless said):
//   bf16-n256         mma_tile: 4 x m64n256k16 a stage (the bf16 forward's loop)
//   fp8-n256          4 x m64n256k32 a stage into the accumulators, no promotion
//   fp8-n64-quarters  16 x m64n64k32 a stage in four 64-column quarters, each
//                     its own commit group, wait_group<1> after each; no promotion
//   fp8-wide          mma_fp8_wide_tile, the fused FP8 forward's loop (quarters,
//                     two 32-register partials, a promotion a quarter)
//   probe-*           the wide loop's structure with its promotion removed,
//                     halved (16 of 32 FFMA a quarter), made FADD, split by
//                     nanosleeps into runs of eight, given an immediate
//                     scale, or the two rows' scales alternating (as the
//                     kernel) or in runs (wide_probe); and the loop in eighths (m64n32k32,
//                     16 FFMA a step: eighths_probe)
// Output: median and spread over the CTAs of cycles per stage, the share of
// the tensor peak (1,024 / cycles) and the launch's time; then fp8-wide with
// warpgroup 1 started 0, 335 and 670 cycles late (does an offset between the
// warpgroups' promotions last, and does it help?). docs/perf-notes.md v9 has
// the first readings.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "wgmma_bench_weight_grad.hpp"
#include "device/gemm/fp8_mainloop.cuh"
#include "device/gemm/tile_mainloop.cuh"
#include "device/ptx/bulk_copy.cuh"

namespace {

using namespace mok::device;

using WideCfg = GemmTileConfig<128, 256, 4, mok::EpilogueKind::kSwiGLUQuantize, mok::ElementType::kE4M3>;
using Bf16Cfg = GemmTileConfig<128, 256, 4, mok::EpilogueKind::kPlain>;
static_assert(sizeof(GemmSharedStorage<WideCfg>) == sizeof(GemmSharedStorage<Bf16Cfg>),
              "the bf16 and e4m3 tiles see the same stages");
constexpr int kStages = WideCfg::kStages;
constexpr int kConsumerWarps = 8;

struct BenchSmem {
  GemmSharedStorage<WideCfg> storage;
  StageScaleSlots<kStages, 128> a_scales;
};

enum class Pattern {
  kBf16N256,
  kFp8N256,
  kFp8N64Quarters,
  kFp8Wide,
  kProbeNoPromotion,
  kProbeHalfPromotion,
  kProbeAddPromotion,
  kProbeSleepPromotion,
  kProbeImmediatePromotion,
  kProbeRowsAlternating,
  kProbeRowsInRuns,
  kProbeEighths,
};

// The wide loop's structure (mma_fp8_wide_tile: quarters, two partials taking
// turns, wait_group<1> after each quarter, wait_group<0> and the next stage's
// wait at the boundary) with the promotion swapped: none (the partials'
// registers fenced only), the first 16 of each quarter's 32 FFMA, or FADD
// (two register reads instead of three). Probes of where the loop's cycles
// go, not arithmetic anyone should use.
enum class Promotion { kNone, kHalf, kAdd, kSleep, kImmediate, kRowsAlternating, kRowsInRuns };
template <Promotion kMode, class Cfg>
__device__ __forceinline__ void wide_probe(GemmSharedStorage<Cfg>& smem, StageRing<Cfg::kStages>& ring, int consumer,
                                           float (&acc)[128], int k_blocks, float scale, float scale_low) {
  const bool releaser = threadIdx.x % 32 == 0;
  float part_even[32], part_odd[32];
  start_promotions(part_even);
  start_promotions(part_odd);
  start_promotions(acc);
  auto promote = [&](float(&part)[32], int quarter) {
    wgmma::fence_operands(part);
    if constexpr (kMode == Promotion::kHalf) {
#pragma unroll
      for (int i = 0; i < 16; ++i) acc[32 * quarter + i] = __fmaf_rn(part[i], scale, acc[32 * quarter + i]);
    } else if constexpr (kMode == Promotion::kSleep) {
      // The full promotion in four runs of eight FFMA, a nanosleep (which
      // yields the issue slot) between runs.
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        acc[32 * quarter + i] = __fmaf_rn(part[i], scale, acc[32 * quarter + i]);
        if (i % 8 == 7 && i < 31) __nanosleep(0);
      }
    } else if constexpr (kMode == Promotion::kImmediate) {
      // The scale a compile-time constant: FFMA's third operand an immediate,
      // two register reads as FADD's.
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[32 * quarter + i] = __fmaf_rn(part[i], 0.5f, acc[32 * quarter + i]);
    } else if constexpr (kMode == Promotion::kRowsAlternating) {
      // As mma_fp8_wide_tile: two scales (the thread's two rows), alternating every two registers.
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        acc[32 * quarter + i] = __fmaf_rn(part[i], ((i / 2) % 2) ? scale_low : scale, acc[32 * quarter + i]);
      }
    } else if constexpr (kMode == Promotion::kRowsInRuns) {
      // The same products, the top row's 16 first, then the low row's: runs
      // of one scale register, which the operand reuse cache can serve.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int i = 4 * j + 2 * h + e;
            acc[32 * quarter + i] = __fmaf_rn(part[i], h ? scale_low : scale, acc[32 * quarter + i]);
          }
        }
      }
    } else if constexpr (kMode == Promotion::kAdd) {
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[32 * quarter + i] = __fadd_rn(part[i], acc[32 * quarter + i]);
    }
  };
  auto take = [&]() {
    ring.consumer_wait();
    const int held = ring.stage;
    ring.advance();
    return held;
  };
  // Without a promotion the quarters accumulate instead of overwriting, so
  // that every wgmma's result stays live (ptxas drops dead ones).
  auto issue = [&](float(&part)[32], uint64_t a, uint64_t b) {
    wgmma::fence_operands(part);
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint64_t ak = wgmma::advance_k_bytes(a, 32 * k), bk = wgmma::advance_k_bytes(b, 32 * k);
      wgmma::mma_m64n64k32_e4m3_sw128_lo(part, static_cast<uint32_t>(ak), static_cast<uint32_t>(bk),
                                         (kMode == Promotion::kNone || k > 0) ? 1u : 0u);
    }
    wgmma::commit_group();
  };
  constexpr uint64_t kQuarterStep = (64 * Cfg::kRowBytes) >> 4;
  int held = take();
  uint64_t a = wgmma::warp_uniform(wgmma::smem_desc_k_sw128(smem.stages[held].a + consumer * 64 * Cfg::kRowBytes));
  uint64_t b = wgmma::warp_uniform(wgmma::smem_desc_k_sw128(smem.stages[held].b));
  issue(part_even, a, b);
  int kb = 0;
  while (true) {
    issue(part_odd, a, b + 1 * kQuarterStep);
    wgmma::wait_group<1>();
    promote(part_even, 0);
    issue(part_even, a, b + 2 * kQuarterStep);
    wgmma::wait_group<1>();
    promote(part_odd, 1);
    issue(part_odd, a, b + 3 * kQuarterStep);
    wgmma::wait_group<1>();
    promote(part_even, 2);
    wgmma::wait_group<0>();
    if (releaser) ring.consumer_release(held);
    if (kb + 1 >= k_blocks) break;
    held = take();
    a = wgmma::warp_uniform(wgmma::smem_desc_k_sw128(smem.stages[held].a + consumer * 64 * Cfg::kRowBytes));
    b = wgmma::warp_uniform(wgmma::smem_desc_k_sw128(smem.stages[held].b));
    issue(part_even, a, b);
    promote(part_odd, 3);
    ++kb;
  }
  promote(part_odd, 3);
  if constexpr (kMode == Promotion::kNone) {
    wgmma::fence_operands(part_even);
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = part_even[i] + part_odd[i];
  }
}

// Cycles warpgroup 1 waits before its first stage (the offset runs).
__constant__ int c_start_delay;
// Nonzero: warpgroup 1 only forwards the stages (skip_tile) and warpgroup 0
// runs the pattern alone (--one-warpgroup).
__constant__ int c_one_warpgroup;
// Nonzero (--feed): the producer brings every stage's 48 KB by bulk copies
// from an L2-resident buffer, as TMA brings a tile's stages, so the stages'
// shared-memory writes and L2 reads are those of a real K loop (the layout
// is not swizzled: the wgmma read whatever bytes land, all of them finite).
__constant__ int c_feed;
constexpr int kFeedWindows = 128;  // 48 KB windows of the source, 6 MB: L2-resident

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

// The wide loop in eighths: eight 32-column steps a stage (m64n32k32 x 4
// each) through two 16-register partials, 16 FFMA a step -- the same 128 FFMA
// a stage as the quarters, in runs half as long.
template <class Cfg>
__device__ __forceinline__ void eighths_probe(GemmSharedStorage<Cfg>& smem, StageRing<Cfg::kStages>& ring,
                                              int consumer, float (&acc)[128], int k_blocks, float scale_top,
                                              float scale_low) {
  const bool releaser = threadIdx.x % 32 == 0;
  float part_even[16], part_odd[16];
  start_promotions(part_even);
  start_promotions(part_odd);
  start_promotions(acc);
  auto issue = [&](float(&part)[16], uint64_t a, uint64_t b) {
    wgmma::fence_operands(part);
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      mma_m64n32k32_e4m3(part, wgmma::advance_k_bytes(a, 32 * k), wgmma::advance_k_bytes(b, 32 * k),
                         k > 0 ? 1u : 0u);
    }
    wgmma::commit_group();
  };
  // d[4j + 2h + e]: row half h, so the scale alternates every two registers.
  auto promote = [&](float(&part)[16], int step) {
    wgmma::fence_operands(part);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      acc[16 * step + i] = __fmaf_rn(part[i], ((i / 2) % 2) ? scale_low : scale_top, acc[16 * step + i]);
    }
  };
  constexpr uint64_t kEighthStep = (32 * Cfg::kRowBytes) >> 4;
  auto take = [&]() {
    ring.consumer_wait();
    const int held = ring.stage;
    ring.advance();
    return held;
  };
  int held = take();
  uint64_t a = wgmma::warp_uniform(wgmma::smem_desc_k_sw128(smem.stages[held].a + consumer * 64 * Cfg::kRowBytes));
  uint64_t b = wgmma::warp_uniform(wgmma::smem_desc_k_sw128(smem.stages[held].b));
  issue(part_even, a, b);
  int kb = 0;
  while (true) {
#pragma unroll
    for (int e = 1; e < 8; e += 2) {
      issue(part_odd, a, b + e * kEighthStep);
      wgmma::wait_group<1>();
      promote(part_even, e - 1);
      if (e < 7) {
        issue(part_even, a, b + (e + 1) * kEighthStep);
        wgmma::wait_group<1>();
        promote(part_odd, e);
      }
    }
    wgmma::wait_group<0>();
    if (releaser) ring.consumer_release(held);
    if (kb + 1 >= k_blocks) break;
    held = take();
    a = wgmma::warp_uniform(wgmma::smem_desc_k_sw128(smem.stages[held].a + consumer * 64 * Cfg::kRowBytes));
    b = wgmma::warp_uniform(wgmma::smem_desc_k_sw128(smem.stages[held].b));
    issue(part_even, a, b);
    promote(part_odd, 7);
    ++kb;
  }
  promote(part_odd, 7);
}

// Consumer side of one pattern over `stages` stages (every thread of the warpgroup).
template <Pattern P>
__device__ __forceinline__ float run_consumer(BenchSmem& smem, StageRing<kStages>& ring, int consumer, int stages,
                                              const uint8_t* b_scales) {
  const bool releaser = threadIdx.x % 32 == 0;
  float sum = 0.f;
  if constexpr (P == Pattern::kBf16N256) {
    float acc[128];
    mma_tile<Bf16Cfg>(reinterpret_cast<GemmSharedStorage<Bf16Cfg>&>(smem.storage), ring, consumer, stages, acc);
    for (int i = 0; i < 128; ++i) sum += acc[i];
  } else if constexpr (P == Pattern::kFp8N256) {
    float acc[128];
    int prev = -1;
    for (int kb = 0; kb < stages; ++kb) {
      ring.consumer_wait();
      auto& stage = smem.storage.stages[ring.stage];
      const uint64_t a = wgmma::smem_desc_k_sw128(stage.a + consumer * 64 * WideCfg::kRowBytes);
      const uint64_t b = wgmma::smem_desc_k_sw128(stage.b);
      wgmma::fence_operands(acc);
      wgmma::fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        mma_m64n256k32_e4m3(acc, wgmma::advance_k_bytes(a, 32 * k), wgmma::advance_k_bytes(b, 32 * k),
                            (kb > 0 || k > 0) ? 1u : 0u);
      }
      wgmma::commit_group();
      wgmma::fence_operands(acc);
      wgmma::wait_group<1>();
      if (prev >= 0 && releaser) ring.consumer_release(prev);
      prev = ring.stage;
      ring.advance();
    }
    wgmma::wait_group<0>();
    wgmma::fence_operands(acc);
    if (releaser) ring.consumer_release(prev);
    for (int i = 0; i < 128; ++i) sum += acc[i];
  } else if constexpr (P == Pattern::kFp8N64Quarters) {
    float q0[32], q1[32], q2[32], q3[32];
    start_promotions(q0);
    start_promotions(q1);
    start_promotions(q2);
    start_promotions(q3);
    constexpr uint64_t kQuarterStep = (64 * WideCfg::kRowBytes) >> 4;
    auto quarter = [&](float(&q)[32], uint64_t a, uint64_t b) {
      wgmma::fence_operands(q);
      wgmma::fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint64_t ak = wgmma::advance_k_bytes(a, 32 * k), bk = wgmma::advance_k_bytes(b, 32 * k);
        wgmma::mma_m64n64k32_e4m3_sw128_lo(q, static_cast<uint32_t>(ak), static_cast<uint32_t>(bk), 1u);
      }
      wgmma::commit_group();
      wgmma::wait_group<1>();
    };
    for (int kb = 0; kb < stages; ++kb) {
      ring.consumer_wait();
      auto& stage = smem.storage.stages[ring.stage];
      const uint64_t a = wgmma::warp_uniform(wgmma::smem_desc_k_sw128(stage.a + consumer * 64 * WideCfg::kRowBytes));
      const uint64_t b = wgmma::warp_uniform(wgmma::smem_desc_k_sw128(stage.b));
      quarter(q0, a, b);
      quarter(q1, a, b + kQuarterStep);
      quarter(q2, a, b + 2 * kQuarterStep);
      quarter(q3, a, b + 3 * kQuarterStep);
      wgmma::wait_group<0>();
      if (releaser) ring.consumer_release(ring.stage);
      ring.advance();
    }
    wgmma::fence_operands(q0);
    wgmma::fence_operands(q1);
    wgmma::fence_operands(q2);
    wgmma::fence_operands(q3);
    for (int i = 0; i < 32; ++i) sum += q0[i] + q1[i] + q2[i] + q3[i];
  } else if constexpr (P == Pattern::kFp8Wide) {
    float acc[128];
    Fp8Scales scales{};
    scales.b = b_scales;
    scales.k_blocks = stages;
    scales.n_blocks = 2;
    scales.m_total = 128;
    const int row = consumer * 64 + static_cast<int>(threadIdx.x % 128 / 32) * 16 + static_cast<int>(threadIdx.x % 32) / 4;
    const uint32_t a_slots = static_cast<uint32_t>(__cvta_generic_to_shared(&smem.a_scales));
    auto release = [&](int s) {
      if (releaser) ring.consumer_release(s);
    };
    mma_fp8_wide_tile<WideCfg>(smem.storage, ring, consumer, acc, scales, a_slots, row, 0, stages, release,
                               TrapOnStall{});
    for (int i = 0; i < 128; ++i) sum += acc[i];
  } else if constexpr (P == Pattern::kProbeEighths) {
    float acc[128];
    const int lane_row = static_cast<int>(threadIdx.x % 32) / 4;
    const float top = ue8m0_value(b_scales[lane_row % 2]), low = ue8m0_value(b_scales[(lane_row + 1) % 2]);
    eighths_probe(smem.storage, ring, consumer, acc, stages, top, low);
    for (int i = 0; i < 128; ++i) sum += acc[i];
  } else {
    static_assert(P == Pattern::kProbeNoPromotion || P == Pattern::kProbeHalfPromotion ||
                  P == Pattern::kProbeAddPromotion || P == Pattern::kProbeSleepPromotion ||
                  P == Pattern::kProbeImmediatePromotion || P == Pattern::kProbeRowsAlternating ||
                  P == Pattern::kProbeRowsInRuns);
    constexpr Promotion kMode = P == Pattern::kProbeNoPromotion     ? Promotion::kNone
                                : P == Pattern::kProbeHalfPromotion ? Promotion::kHalf
                                : P == Pattern::kProbeAddPromotion  ? Promotion::kAdd
                                : P == Pattern::kProbeSleepPromotion ? Promotion::kSleep
                                : P == Pattern::kProbeImmediatePromotion ? Promotion::kImmediate
                                : P == Pattern::kProbeRowsAlternating    ? Promotion::kRowsAlternating
                                                                         : Promotion::kRowsInRuns;
    float acc[128];
    // Per-thread scales, as the kernel's (each thread's rows have their own
    // A scale): read at lane-dependent places, so not uniform registers.
    const int lane_row = static_cast<int>(threadIdx.x % 32) / 4;
    wide_probe<kMode>(smem.storage, ring, consumer, acc, stages, ue8m0_value(b_scales[lane_row % 2]),
                      ue8m0_value(b_scales[(lane_row + 1) % 2]));
    for (int i = 0; i < 128; ++i) sum += acc[i];
  }
  return sum;
}

template <Pattern P>
__global__ void __launch_bounds__(WideCfg::kThreads, 1)
    wgmma_pattern_kernel(int stages, const uint8_t* b_scales, const uint8_t* feed, long long* cycles, float* sink) {
  extern __shared__ uint8_t dynamic_smem[];
  auto& smem = *reinterpret_cast<BenchSmem*>((reinterpret_cast<uintptr_t>(dynamic_smem) + 1023) & ~uintptr_t{1023});
  // Operands: finite e4m3 bytes (bit 6 clear: exponent field < 15, no NaN)
  // that are also finite bf16 pairs; every A scale 2^0.
  auto* words = reinterpret_cast<uint32_t*>(&smem.storage.stages[0]);
  const int n_words = static_cast<int>(sizeof(smem.storage.stages) / 4);
  for (int i = threadIdx.x; i < n_words; i += blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ (blockIdx.x * 40503u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    words[i] = h & 0x3b3b3b3bu;
  }
  for (int i = threadIdx.x; i < kStages * 128; i += blockDim.x) (&smem.a_scales.rows[0][0])[i] = 127;
  if (threadIdx.x == 0) StageRing<kStages>::init(smem.storage.full, smem.storage.empty, kConsumerWarps);
  fence_proxy_async_shared();
  __syncthreads();
  StageRing<kStages> ring{smem.storage.full, smem.storage.empty};
  const int warpgroup = static_cast<int>(threadIdx.x / 128);
  if (warpgroup == 0) {
    wgmma::setmaxnreg_dec<WideCfg::kProducerRegs>();
    if (threadIdx.x == 0) {
      constexpr uint32_t kA = WideCfg::kABytes, kB = WideCfg::kBBytes;
      for (int kb = 0; kb < stages; ++kb) {
        uint64_t* full = ring.producer_acquire(c_feed != 0 ? kA + kB : 0);
        if (c_feed != 0) {
          const uint8_t* src = feed + static_cast<size_t>((blockIdx.x * 7 + kb) % kFeedWindows) * (kA + kB);
          bulk_load(smem.storage.stages[ring.stage].a, src, kA, full);
          bulk_load(smem.storage.stages[ring.stage].b, src + kA, kB, full);
        }
        ring.advance();
      }
    }
    return;
  }
  wgmma::setmaxnreg_inc<WideCfg::kConsumerRegs>();
  const int consumer = warpgroup - 1;
  const long long begin = clock64();
  if (consumer == 1) {
    while (clock64() - begin < c_start_delay) {
    }
  }
  float sum = 0.f;
  if (c_one_warpgroup != 0 && __shfl_sync(0xffffffffu, consumer, 0) == 1) {
    skip_tile<WideCfg>(ring, stages);
  } else {
    sum = run_consumer<P>(smem, ring, consumer, stages, b_scales);
  }
  const long long end = clock64();
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + consumer] = end - begin;
  if (sum == 12345.f) *sink = sum;  // keeps the loop's results live
}

struct Named {
  const char* name;
  void (*kernel)(int, const uint8_t*, const uint8_t*, long long*, float*);
};

int parse_int(const char* text, const char* option) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 1 || value > (1 << 20)) {
    std::fprintf(stderr, "mok_wgmma_bench: %s needs a positive integer, got '%s'\n", option, text);
    std::exit(2);
  }
  return static_cast<int>(value);
}

}  // namespace

int main(int argc, char** argv) {
  int stages = 4096, reps = 3;
  bool one_warpgroup = false, feed_stages = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--stages" && i + 1 < argc) {
      stages = parse_int(argv[++i], "--stages");
    } else if (arg == "--feed") {
      feed_stages = true;
    } else if (arg == "--one-warpgroup") {
      one_warpgroup = true;
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = parse_int(argv[++i], "--reps");
    } else {
      std::fprintf(stderr, "usage: mok_wgmma_bench [--stages N] [--reps R] [--one-warpgroup] [--feed]\n");
      return arg == "--help" || arg == "-h" ? 0 : 2;
    }
  }
  int device = 0, sms = 0, major = 0;
  MOK_CUDA_CHECK(cudaGetDevice(&device));
  MOK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  MOK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major != 9) {
    std::fprintf(stderr, "mok_wgmma_bench: needs a Hopper GPU (sm_90a)\n");
    return 1;
  }
  const Named patterns[] = {
      {"bf16-n256", wgmma_pattern_kernel<Pattern::kBf16N256>},
      {"fp8-n256", wgmma_pattern_kernel<Pattern::kFp8N256>},
      {"fp8-n64-quarters", wgmma_pattern_kernel<Pattern::kFp8N64Quarters>},
      {"fp8-wide", wgmma_pattern_kernel<Pattern::kFp8Wide>},
      {"probe-no-promotion", wgmma_pattern_kernel<Pattern::kProbeNoPromotion>},
      {"probe-half-ffma", wgmma_pattern_kernel<Pattern::kProbeHalfPromotion>},
      {"probe-fadd", wgmma_pattern_kernel<Pattern::kProbeAddPromotion>},
      {"probe-ffma-sleeps", wgmma_pattern_kernel<Pattern::kProbeSleepPromotion>},
      {"probe-ffma-immediate", wgmma_pattern_kernel<Pattern::kProbeImmediatePromotion>},
      {"probe-rows-alternating", wgmma_pattern_kernel<Pattern::kProbeRowsAlternating>},
      {"probe-rows-in-runs", wgmma_pattern_kernel<Pattern::kProbeRowsInRuns>},
      {"probe-eighths", wgmma_pattern_kernel<Pattern::kProbeEighths>},
  };
  const size_t smem_bytes = sizeof(BenchSmem) + 1024;
  const int one_flag = one_warpgroup ? 1 : 0, feed_flag = feed_stages ? 1 : 0;
  MOK_CUDA_CHECK(cudaMemcpyToSymbol(c_feed, &feed_flag, sizeof(int)));
  uint8_t* feed = nullptr;
  const size_t feed_bytes = static_cast<size_t>(kFeedWindows) * (WideCfg::kABytes + WideCfg::kBBytes);
  MOK_CUDA_CHECK(cudaMalloc(&feed, feed_bytes));
  MOK_CUDA_CHECK(cudaMemset(feed, 0x3b, feed_bytes));  // finite as e4m3 and as bf16 pairs
  MOK_CUDA_CHECK(cudaMemcpyToSymbol(c_one_warpgroup, &one_flag, sizeof(int)));
  uint8_t* b_scales = nullptr;
  long long* cycles = nullptr;
  float* sink = nullptr;
  MOK_CUDA_CHECK(cudaMalloc(&b_scales, 2 * static_cast<size_t>(stages)));
  MOK_CUDA_CHECK(cudaMemset(b_scales, 127, 2 * static_cast<size_t>(stages)));
  MOK_CUDA_CHECK(cudaMalloc(&cycles, sizeof(long long) * 2 * sms));
  MOK_CUDA_CHECK(cudaMalloc(&sink, sizeof(float)));
  cudaEvent_t start, stop;
  MOK_CUDA_CHECK(cudaEventCreate(&start));
  MOK_CUDA_CHECK(cudaEventCreate(&stop));
  std::printf("mok_wgmma_bench: %d CTAs, %d stages each, %zu B of shared memory, %s; %d cycles of tensor work a stage\n",
              sms, stages, smem_bytes, one_warpgroup ? "warpgroup 0 alone" : "two warpgroups", one_warpgroup ? 512 : 1024);
  std::printf("%-22s %5s %14s %14s %10s %10s\n", "pattern", "rep", "cycles/stage", "(min..max)", "tensor %", "ms");
  for (const Named& p : patterns) {
    MOK_CUDA_CHECK(cudaFuncSetAttribute(p.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem_bytes)));
    for (int rep = 0; rep < reps; ++rep) {
      MOK_CUDA_CHECK(cudaMemset(cycles, 0, sizeof(long long) * 2 * sms));
      MOK_CUDA_CHECK(cudaEventRecord(start));
      p.kernel<<<sms, WideCfg::kThreads, smem_bytes>>>(stages, b_scales, feed, cycles, sink);
      MOK_CUDA_CHECK(cudaGetLastError());
      MOK_CUDA_CHECK(cudaEventRecord(stop));
      MOK_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.f;
      MOK_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      std::vector<long long> host(2 * static_cast<size_t>(sms));
      MOK_CUDA_CHECK(cudaMemcpy(host.data(), cycles, sizeof(long long) * host.size(), cudaMemcpyDeviceToHost));
      // With --one-warpgroup, warpgroup 1 only forwards the stages.
      std::vector<double> per_stage;
      for (size_t i = 0; i < host.size(); ++i) {
        if (one_warpgroup && i % 2 == 1) continue;
        per_stage.push_back(static_cast<double>(host[i]) / stages);
      }
      std::sort(per_stage.begin(), per_stage.end());
      const double median = per_stage[per_stage.size() / 2];
      std::printf("%-22s %5d %14.1f %6.1f..%-7.1f %9.1f%% %10.3f\n", p.name, rep, median, per_stage.front(),
                  per_stage.back(), 100.0 * (one_warpgroup ? 512.0 : 1024.0) / median, ms);
    }
  }
  // Warpgroup 1 started late: do the two warpgroups' stage boundaries and
  // promotions stay apart once apart?
  for (const int delay : {0, 335, 670}) {
    if (one_warpgroup) break;
    MOK_CUDA_CHECK(cudaMemcpyToSymbol(c_start_delay, &delay, sizeof(int)));
    MOK_CUDA_CHECK(cudaMemset(cycles, 0, sizeof(long long) * 2 * sms));
    wgmma_pattern_kernel<Pattern::kFp8Wide><<<sms, WideCfg::kThreads, smem_bytes>>>(stages, b_scales, feed, cycles, sink);
    MOK_CUDA_CHECK(cudaGetLastError());
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<long long> host(2 * static_cast<size_t>(sms));
    MOK_CUDA_CHECK(cudaMemcpy(host.data(), cycles, sizeof(long long) * host.size(), cudaMemcpyDeviceToHost));
    std::vector<double> wg0, wg1;
    for (size_t i = 0; i < host.size(); ++i) (i % 2 ? wg1 : wg0).push_back(static_cast<double>(host[i]) / stages);
    std::sort(wg0.begin(), wg0.end());
    std::sort(wg1.begin(), wg1.end());
    std::printf("fp8-wide, warpgroup 1 %4d cycles late: cycles/stage %.1f (warpgroup 0) %.1f (warpgroup 1, from its start)\n",
                delay, wg0[wg0.size() / 2], wg1[wg1.size() / 2]);
  }
  MOK_CUDA_CHECK(cudaFree(b_scales));
  MOK_CUDA_CHECK(cudaFree(feed));
  if (!one_warpgroup && !feed_stages) mok::tools::run_weight_grad_patterns(sms, 64, 16, reps);
  MOK_CUDA_CHECK(cudaFree(cycles));
  MOK_CUDA_CHECK(cudaFree(sink));
  return 0;
}
