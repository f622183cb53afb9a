// mok_wgmma_bench's weight-gradient table. The grouped weight gradient's
// tiles have short K loops (K = an expert's rows, ~1024: 16 k-blocks of 64)
// and each ends in a drain and an epilogue, where its kernel loses ~13% per
// clock against dx's long-K GEMM (docs/perf-notes.md v5, v6). Here each CTA
// runs `tiles` tiles of `k_blocks` k-blocks on resident stages (a producer
// thread announces each stage with zero bytes), through the kernel's own
// device functions:
//   loop        mma_weight_grad_tile alone: the K loop, its drain, the next
//               tile's first stage -- what a tile pays besides its tensor work
//               with no epilogue
//   loop+store  the bf16 path as weight_grad_kernel runs it: the last stage
//               held, the tile written into it (stmatrix) and stored by TMA
//               to a real output during the next tile's K loop
// and prints cycles per tile against k_blocks x 1,024 of tensor work. The
// loop at 4 x k_blocks as well separates a tile's fixed cost from its
// per-k-block one.
#include "wgmma_bench_weight_grad.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "common/cuda_check.hpp"
#include "device/gemm/weight_grad_tile.cuh"
#include "device/host/gemm_host.hpp"
#include "wgmma_bench_cycles.hpp"
#include "wgmma_bench_fill.cuh"

namespace mok::tools {
namespace {

using namespace mok::device;

using WeightGradCfg =
    GemmTileConfig<128, 256, 4, EpilogueKind::kWeightGrad, ElementType::kBF16, OperandMajor::kMN, OperandMajor::kMN>;
constexpr int kClearBarrier = 1;  // the consumers' named barrier (0 is __syncthreads)
constexpr int kOutM = 1024;       // each CTA's output: [kOutM][kOutN] bf16, tiles cycling over it
constexpr int kOutN = 2048;

template <bool kStore>
__global__ void __launch_bounds__(WeightGradCfg::kThreads, 1)
    weight_grad_pattern_kernel(const __grid_constant__ CUtensorMap out_map, int tiles, int k_blocks, long long* cycles,
                               float* sink) {
  using Cfg = WeightGradCfg;
  extern __shared__ uint8_t dynamic_smem[];
  auto& smem = *reinterpret_cast<GemmSharedStorage<Cfg>*>((reinterpret_cast<uintptr_t>(dynamic_smem) + 1023) &
                                                          ~uintptr_t{1023});
  // Finite bf16 operands (bit 14 clear: exponents below 128).
  fill_finite_words(reinterpret_cast<uint32_t*>(&smem.stages[0]), static_cast<int>(sizeof(smem.stages) / 4),
                    0xbfbfbfbfu);
  if (threadIdx.x == 0) {
    StageRing<Cfg::kStages>::init(smem.full, smem.empty, Cfg::kConsumerWarps);
    tma_prefetch_descriptor(&out_map);
  }
  fence_proxy_async_shared();
  __syncthreads();
  StageRing<Cfg::kStages> ring{smem.full, smem.empty};
  const int warpgroup = static_cast<int>(threadIdx.x / 128);
  if (warpgroup == 0) {
    wgmma::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) {
      for (int i = 0; i < tiles * k_blocks; ++i) {
        ring.producer_acquire(0);
        ring.advance();
      }
    }
    return;
  }
  wgmma::setmaxnreg_inc<Cfg::kConsumerRegs>();
  const int consumer = warpgroup - 1;
  constexpr int kMTiles = kOutM / Cfg::kBlockM, kNTiles = kOutN / Cfg::kBlockN;
  float acc[Cfg::kAccRegs];
  HeldStage held;
  const long long begin = clock64();
  for (int t = 0; t < tiles; ++t) {
    WeightGradTile tile;
    tile.group = static_cast<int>(blockIdx.x);
    tile.m0 = (t % kMTiles) * Cfg::kBlockM;
    tile.n0 = (t / kMTiles % kNTiles) * Cfg::kBlockN;
    tile.row0 = 0;
    tile.rows = k_blocks * Cfg::kBlockK;
    mma_weight_grad_tile<Cfg>(smem, ring, consumer, tile, acc, kClearBarrier, held, kStore);
    if constexpr (kStore) {
      store_weight_grad_tile_async<Cfg>(acc, smem, consumer, tile, &out_map, kOutM, kOutN, held, kClearBarrier);
    }
  }
  if (held.stage >= 0 && threadIdx.x % 32 == 0) bulk_wait_all();
  const long long end = clock64();
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + consumer] = end - begin;
  if (!kStore && acc[0] == 12345.f) *sink = acc[1];  // keeps the loop's results live
}

}  // namespace

void run_weight_grad_patterns(int ctas, int tiles, int k_blocks, int reps) {
  using Cfg = WeightGradCfg;
  const size_t smem_bytes = sizeof(GemmSharedStorage<Cfg>) + 1024;
  uint16_t* out = nullptr;
  const size_t out_elems = static_cast<size_t>(ctas) * kOutM * kOutN;
  MOK_CUDA_CHECK(cudaMalloc(&out, out_elems * sizeof(uint16_t)));
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kOutN), static_cast<cuuint64_t>(ctas) * kOutM};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kOutN) * 2};
  const cuuint32_t box[2] = {64, 64};  // the kernel's: [64 rows][64 columns] a box (tile_store_async.cuh)
  const CUtensorMap out_map = device::encode_bf16_map("weight-gradient bench output", out, 2, dims, strides, box);
  long long* cycles = nullptr;
  float* sink = nullptr;
  MOK_CUDA_CHECK(cudaMalloc(&cycles, sizeof(long long) * 2 * ctas));
  MOK_CUDA_CHECK(cudaMalloc(&sink, sizeof(float)));
  struct Row {
    const char* name;
    void (*kernel)(CUtensorMap, int, int, long long*, float*);
    int k_blocks;
  };
  const Row rows[] = {{"loop", weight_grad_pattern_kernel<false>, k_blocks},
                      {"loop", weight_grad_pattern_kernel<false>, 4 * k_blocks},
                      {"loop+store", weight_grad_pattern_kernel<true>, k_blocks}};
  std::printf("\nweight-gradient tiles (128 x 256, bf16, MN-major operands): %d CTAs, %d tiles each; %zu B of shared "
              "memory\n",
              ctas, tiles, smem_bytes);
  std::printf("%-12s %8s %5s %14s %14s %10s\n", "pattern", "k-blocks", "rep", "cycles/tile", "tensor cycles",
              "tensor %");
  for (const Row& row : rows) {
    MOK_CUDA_CHECK(cudaFuncSetAttribute(row.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem_bytes)));
    for (int rep = 0; rep < reps; ++rep) {
      MOK_CUDA_CHECK(cudaMemset(cycles, 0, sizeof(long long) * 2 * ctas));
      row.kernel<<<ctas, Cfg::kThreads, smem_bytes>>>(out_map, tiles, row.k_blocks, cycles, sink);
      MOK_CUDA_CHECK(cudaGetLastError());
      MOK_CUDA_CHECK(cudaDeviceSynchronize());
      const double per_tile = median_of(read_spans(cycles, ctas, -1, tiles));
      const double tensor = 1024.0 * row.k_blocks;
      std::printf("%-12s %8d %5d %14.1f %14.0f %9.1f%%\n", row.name, row.k_blocks, rep, per_tile, tensor,
                  100.0 * tensor / per_tile);
    }
  }
  MOK_CUDA_CHECK(cudaFree(out));
  MOK_CUDA_CHECK(cudaFree(cycles));
  MOK_CUDA_CHECK(cudaFree(sink));
}

}  // namespace mok::tools
