// mok_wgmma_bench: the tensor-core issue patterns of mok's K loops, timed in
// SM cycles without the memory traffic of a real loop. Each CTA (one per SM)
// runs one long K loop over four resident shared-memory stages (48 KB each:
// a 128-row A box and a 256-row B box, as the 128 x 256 tiles load), with
// the stage ring's barriers but no TMA: a producer thread announces each
// stage with zero bytes. So a pattern's cycles per stage are what its
// instructions, waits and tensor work cost alone, against 1,024 cycles of
// tensor work a stage (128 x 256 x 64 bf16 or 128 x 256 x 128 e4m3 MACs at
// the SM's dense rate). A kernel's K loop that takes longer than its pattern
// here loses the rest to memory (the TMA's writes, L2, the stage waits).
//
//   mok_wgmma_bench [--stages N] [--reps R] [--one-warpgroup] [--feed] [--ctas N] [--only TEXT]
//
// --one-warpgroup: warpgroup 1 only forwards the stages, so each pattern's
// cycles are one warpgroup's (512 cycles of tensor work a stage).
// --feed: each stage's 48 KB is brought by bulk copies from an L2-resident
// buffer, so the loop also pays a real loop's shared-memory writes.
// --ctas N: N CTAs instead of one per SM (with --feed, fewer CTAs share the
// L2's bandwidth: a loop bound by it gets faster, one bound by its own SM's
// shared-memory writes does not). --only TEXT: the patterns whose name
// contains TEXT (and no late-start rows unless fp8-wide is among them).
// Without either, a second table follows: the weight gradient's short-K
// tiles, their drain and their epilogue (wgmma_bench_weight_grad.cu).
//
// Patterns (two consumer warpgroups, 64 rows each, unless said):
//   bf16-n256         mma_tile: 4 x m64n256k16 a stage (the bf16 forward's loop)
//   bf16-mn-n256      the weight gradient's loop: both operands MN-major, 4 x
//                     m64n256k16 a stage
//   bf16-mn-n128x2    the same stage as two column halves, 4 x m64n128k16 on
//                     each, one after the other (each half its own accumulators:
//                     what a tile's store of one half under the other's
//                     wgmma would issue; docs/perf-notes.md v33)
//   fp8-n256          4 x m64n256k32 a stage into the accumulators, no promotion
//   fp8-n64-quarters  16 x m64n64k32 a stage in four 64-column quarters, each
//                     its own commit group, wait_group<1> after each; no promotion
//   fp8-wide          mma_fp8_wide_tile, the fused FP8 forward's loop (quarters,
//                     two 32-register partials, a promotion a quarter)
//   probe-*           the wide loop's structure (wgmma_bench_probes.cuh) with
//                     its promotion removed, halved (16 of 32 FFMA a quarter),
//                     made FADD, split by nanosleeps into runs of eight, given
//                     an immediate scale, or with the two rows' scales
//                     alternating (as the kernel) or in runs; and the loop in
//                     eighths (m64n32k32, 16 FFMA a step)
// Output: median and spread over the CTAs of cycles per stage, the share of
// the tensor peak (1,024 / cycles) and the launch's time; then fp8-wide with
// warpgroup 1 started 0, 335 and 670 cycles late (does an offset between the
// warpgroups' promotions last, and does it help?). docs/perf-notes.md v9 has
// the first readings.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "wgmma_bench_cycles.hpp"
#include "wgmma_bench_fill.cuh"
#include "wgmma_bench_probes.cuh"
#include "wgmma_bench_weight_grad.hpp"
#include "device/gemm/fp8_mainloop.cuh"
#include "device/gemm/tile_mainloop.cuh"
#include "device/ptx/bulk_copy.cuh"

namespace {

using namespace mok::device;
using mok::tools::fill_finite_words;
using mok::tools::Promotion;
using mok::tools::stepped_probe;
using mok::tools::mma_m64n256k32_e4m3;

using WideCfg = GemmTileConfig<128, 256, 4, mok::EpilogueKind::kSwiGLUQuantize, mok::ElementType::kE4M3>;
using Bf16Cfg = GemmTileConfig<128, 256, 4, mok::EpilogueKind::kPlain>;
static_assert(sizeof(GemmSharedStorage<WideCfg>) == sizeof(GemmSharedStorage<Bf16Cfg>),
              "the bf16 and e4m3 tiles see the same stages");
constexpr int kStages = WideCfg::kStages;
constexpr int kConsumerWarps = 8;

// fp8-wide reads one B-scale pair per stage from a table in shared memory,
// as the fused kernel reads a task's (TileBScalePairs): one pair per stage of
// the whole run, so --stages is at most kMaxBenchStages.
constexpr int kMaxBenchStages = 4096;

struct BenchSmem {
  GemmSharedStorage<WideCfg> storage;
  StageScaleSlots<kStages, 128> a_scales;
  alignas(16) uint8_t b_pairs[kMaxBenchStages][2];
};

enum class Pattern {
  kBf16N256,
  kBf16MnN256,
  kBf16MnN128x2,
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

// A stage loop's step once its group is committed and the one before waited
// for: the previous stage handed back (one arrival a warp), the ring moved on.
__device__ __forceinline__ void release_previous(StageRing<kStages>& ring, int& prev, bool releaser) {
  if (prev >= 0 && releaser) ring.consumer_release(prev);
  prev = ring.stage;
  ring.advance();
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
  } else if constexpr (P == Pattern::kBf16MnN256 || P == Pattern::kBf16MnN128x2) {
    // The weight gradient's K loop: both operands MN-major, boxes of [64
    // rows][64 columns] (A: this warpgroup's box; B: four), imm-trans on
    // both; n256: 4 x m64n256k16 a stage (mma_weight_grad_tile's); n128x2:
    // the stage's four k16 steps on the B boxes 0-1 (columns 0-127), then
    // on boxes 2-3, each half its own 64 accumulators.
    constexpr uint32_t kBox = 64 * WideCfg::kRowBytes;
    float lo[64], hi[64];
    float acc[128];
    int prev = -1;
    for (int kb = 0; kb < stages; ++kb) {
      ring.consumer_wait();
      auto& stage = smem.storage.stages[ring.stage];
      const uint64_t a = wgmma::smem_desc_mn_sw128(stage.a + consumer * kBox, kBox);
      const uint64_t b = wgmma::smem_desc_mn_sw128(stage.b, kBox);
      if constexpr (P == Pattern::kBf16MnN256) {
        wgmma::fence_operands(acc);
        wgmma::fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          wgmma::mma_m64n256k16<1, 1>(acc, wgmma::advance_k_mn(a, 16 * k), wgmma::advance_k_mn(b, 16 * k),
                                      (kb > 0 || k > 0) ? 1u : 0u);
        }
        wgmma::commit_group();
        wgmma::fence_operands(acc);
      } else {
        // One half's four k16 steps: B from box `box` on (0: lo, 2: hi).
        const auto half = [&](float(&h)[64], int box) {
          const uint64_t bh = wgmma::smem_desc_mn_sw128(stage.b + box * kBox, kBox);
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            wgmma::mma_m64n128k16<1, 1>(h, wgmma::advance_k_mn(a, 16 * k), wgmma::advance_k_mn(bh, 16 * k),
                                        (kb > 0 || k > 0) ? 1u : 0u);
          }
        };
        wgmma::fence_operands(lo);
        wgmma::fence_operands(hi);
        wgmma::fence();
        half(lo, 0);
        half(hi, 2);
        wgmma::commit_group();
        wgmma::fence_operands(lo);
        wgmma::fence_operands(hi);
      }
      wgmma::wait_group<1>();
      release_previous(ring, prev, releaser);
    }
    wgmma::wait_group<0>();
    if (releaser) ring.consumer_release(prev);
    if constexpr (P == Pattern::kBf16MnN256) {
      wgmma::fence_operands(acc);
      for (int i = 0; i < 128; ++i) sum += acc[i];
    } else {
      wgmma::fence_operands(lo);
      wgmma::fence_operands(hi);
      for (int i = 0; i < 64; ++i) sum += lo[i] + hi[i];
    }
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
      release_previous(ring, prev, releaser);
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
    const int row =
        consumer * 64 + static_cast<int>(threadIdx.x % 128 / 32) * 16 + static_cast<int>(threadIdx.x % 32) / 4;
    const uint32_t a_slots = static_cast<uint32_t>(__cvta_generic_to_shared(&smem.a_scales));
    auto release = [&](int s) {
      if (releaser) ring.consumer_release(s);
    };
    mma_fp8_wide_tile<WideCfg>(smem.storage, ring, consumer, acc, scales, a_slots, row,
                               static_cast<uint32_t>(__cvta_generic_to_shared(&smem.b_pairs)), release, TrapOnStall{});
    for (int i = 0; i < 128; ++i) sum += acc[i];
  } else {
    constexpr int kCols = P == Pattern::kProbeEighths ? 32 : 64;
    constexpr Promotion kMode = P == Pattern::kProbeNoPromotion          ? Promotion::kNone
                                : P == Pattern::kProbeHalfPromotion      ? Promotion::kHalf
                                : P == Pattern::kProbeAddPromotion       ? Promotion::kAdd
                                : P == Pattern::kProbeSleepPromotion     ? Promotion::kSleep
                                : P == Pattern::kProbeImmediatePromotion ? Promotion::kImmediate
                                : P == Pattern::kProbeRowsInRuns         ? Promotion::kRowsInRuns
                                                                         : Promotion::kRowsAlternating;
    float acc[128];
    // Per-thread scales, as the kernel's (each thread's rows have their own
    // A scale): read at lane-dependent places, so not uniform registers.
    const int lane_row = static_cast<int>(threadIdx.x % 32) / 4;
    stepped_probe<kCols, kMode>(smem.storage, ring, consumer, acc, stages, ue8m0_value(b_scales[lane_row % 2]),
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
  fill_finite_words(reinterpret_cast<uint32_t*>(&smem.storage.stages[0]),
                    static_cast<int>(sizeof(smem.storage.stages) / 4), 0x3b3b3b3bu);
  for (int i = threadIdx.x; i < kStages * 128; i += blockDim.x) (&smem.a_scales.rows[0][0])[i] = 127;
  for (int i = threadIdx.x; i < kMaxBenchStages * 2; i += blockDim.x) (&smem.b_pairs[0][0])[i] = 127;
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
  int stages = 4096, reps = 3, ctas = 0;
  bool one_warpgroup = false, feed_stages = false;
  std::string only;
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
    } else if (arg == "--ctas" && i + 1 < argc) {
      ctas = parse_int(argv[++i], "--ctas");
    } else if (arg == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: mok_wgmma_bench [--stages N] [--reps R] [--one-warpgroup] [--feed] [--ctas N] "
                   "[--only TEXT]\n");
      return arg == "--help" || arg == "-h" ? 0 : 2;
    }
  }
  int device = 0, sms = 0, major = 0;
  MOK_CUDA_CHECK(cudaGetDevice(&device));
  MOK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  MOK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (stages > kMaxBenchStages) {
    std::fprintf(stderr, "mok_wgmma_bench: --stages is at most %d (fp8-wide's B-scale table holds a pair per stage)\n",
                 kMaxBenchStages);
    return 2;
  }
  const int grid = ctas > 0 ? ctas : sms;  // one CTA per SM fits (a CTA takes most of an SM's shared memory)
  if (major != 9) {
    std::fprintf(stderr, "mok_wgmma_bench: needs a Hopper GPU (sm_90a)\n");
    return 1;
  }
  const Named patterns[] = {
      {"bf16-n256", wgmma_pattern_kernel<Pattern::kBf16N256>},
      {"bf16-mn-n256", wgmma_pattern_kernel<Pattern::kBf16MnN256>},
      {"bf16-mn-n128x2", wgmma_pattern_kernel<Pattern::kBf16MnN128x2>},
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
  uint8_t* feed = nullptr;  // only read with --feed
  if (feed_stages) {
    const size_t feed_bytes = static_cast<size_t>(kFeedWindows) * (WideCfg::kABytes + WideCfg::kBBytes);
    MOK_CUDA_CHECK(cudaMalloc(&feed, feed_bytes));
    MOK_CUDA_CHECK(cudaMemset(feed, 0x3b, feed_bytes));  // finite as e4m3 and as bf16 pairs
  }
  MOK_CUDA_CHECK(cudaMemcpyToSymbol(c_one_warpgroup, &one_flag, sizeof(int)));
  uint8_t* b_scales = nullptr;
  long long* cycles = nullptr;
  float* sink = nullptr;
  MOK_CUDA_CHECK(cudaMalloc(&b_scales, 2 * static_cast<size_t>(stages)));
  MOK_CUDA_CHECK(cudaMemset(b_scales, 127, 2 * static_cast<size_t>(stages)));
  MOK_CUDA_CHECK(cudaMalloc(&cycles, sizeof(long long) * 2 * grid));
  MOK_CUDA_CHECK(cudaMalloc(&sink, sizeof(float)));
  cudaEvent_t start, stop;
  MOK_CUDA_CHECK(cudaEventCreate(&start));
  MOK_CUDA_CHECK(cudaEventCreate(&stop));
  std::printf("mok_wgmma_bench: %d CTAs, %d stages each, %zu B of shared memory, %s%s; %d cycles of tensor work "
              "a stage\n",
              grid, stages, smem_bytes, one_warpgroup ? "warpgroup 0 alone" : "two warpgroups",
              feed_stages ? ", stages fed from L2" : "", one_warpgroup ? 512 : 1024);
  std::printf("%-22s %5s %14s %14s %10s %10s\n", "pattern", "rep", "cycles/stage", "(min..max)", "tensor %", "ms");
  bool wide_ran = false;
  for (const Named& p : patterns) {
    if (!only.empty() && std::string(p.name).find(only) == std::string::npos) continue;
    wide_ran = wide_ran || std::string(p.name) == "fp8-wide";
    MOK_CUDA_CHECK(cudaFuncSetAttribute(p.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem_bytes)));
    for (int rep = 0; rep < reps; ++rep) {
      MOK_CUDA_CHECK(cudaMemset(cycles, 0, sizeof(long long) * 2 * grid));
      MOK_CUDA_CHECK(cudaEventRecord(start));
      p.kernel<<<grid, WideCfg::kThreads, smem_bytes>>>(stages, b_scales, feed, cycles, sink);
      MOK_CUDA_CHECK(cudaGetLastError());
      MOK_CUDA_CHECK(cudaEventRecord(stop));
      MOK_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.f;
      MOK_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      // With --one-warpgroup, warpgroup 1 only forwards the stages.
      const std::vector<double> per_stage = mok::tools::read_spans(cycles, grid, one_warpgroup ? 0 : -1, stages);
      const double median = mok::tools::median_of(per_stage);
      std::printf("%-22s %5d %14.1f %6.1f..%-7.1f %9.1f%% %10.3f\n", p.name, rep, median, per_stage.front(),
                  per_stage.back(), 100.0 * (one_warpgroup ? 512.0 : 1024.0) / median, ms);
    }
  }
  // Warpgroup 1 started late: do the two warpgroups' stage boundaries and
  // promotions stay apart once apart?
  for (const int delay : {0, 335, 670}) {
    if (one_warpgroup || (!only.empty() && !wide_ran)) break;
    MOK_CUDA_CHECK(cudaMemcpyToSymbol(c_start_delay, &delay, sizeof(int)));
    MOK_CUDA_CHECK(cudaMemset(cycles, 0, sizeof(long long) * 2 * grid));
    wgmma_pattern_kernel<Pattern::kFp8Wide>
        <<<grid, WideCfg::kThreads, smem_bytes>>>(stages, b_scales, feed, cycles, sink);
    MOK_CUDA_CHECK(cudaGetLastError());
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
    std::printf("fp8-wide, warpgroup 1 %4d cycles late: cycles/stage %.1f (warpgroup 0) %.1f (warpgroup 1, from "
                "its start)\n",
                delay, mok::tools::median_of(mok::tools::read_spans(cycles, grid, 0, stages)),
                mok::tools::median_of(mok::tools::read_spans(cycles, grid, 1, stages)));
  }
  MOK_CUDA_CHECK(cudaEventDestroy(start));
  MOK_CUDA_CHECK(cudaEventDestroy(stop));
  MOK_CUDA_CHECK(cudaFree(b_scales));
  MOK_CUDA_CHECK(cudaFree(feed));
  if (!one_warpgroup && !feed_stages && only.empty() && ctas == 0) mok::tools::run_weight_grad_patterns(sms, 64, 16, reps);
  MOK_CUDA_CHECK(cudaFree(cycles));
  MOK_CUDA_CHECK(cudaFree(sink));
  return 0;
}
