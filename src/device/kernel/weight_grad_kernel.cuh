// The standalone persistent weight-gradient kernel: setup, then one branch
// per warpgroup role (warpgroup 0 the TMA producer, 1.. the consumers), all
// walking the same task list (sched/weight_grad_tiles.cuh). out_map: the
// bf16 output as bf16 {n, groups x m}, box {64, 64}, 128-byte swizzle (bf16
// tiles are stored by TMA); unused for fp32 output.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "device/gemm/tile_config.cuh"
#include "device/gemm/weight_grad_tile.cuh"
#include "device/pipeline/stage_ring.cuh"
#include "device/ptx/async_copy.cuh"
#include "device/ptx/bulk_copy.cuh"
#include "device/ptx/wgmma.cuh"
#include "device/sched/group_table.cuh"
#include "device/sched/weight_grad_tiles.cuh"

namespace mok::device {

struct WeightGradParams {
  float* out;                   // fp32 [num_groups, m, n], or null and
  uint16_t* out_bf16;           // bf16 [num_groups, m, n]
  const int32_t* group_offset;  // [num_groups + 1]
  const int32_t* group_rows;    // [num_groups]
  int num_groups;
  int m;
  int n;
  int accumulate;  // nonzero: out += the sum (fp32 out; bf16 out: the kernel's kBf16Add)
};

// Named barriers of this kernel (0 is __syncthreads).
inline constexpr int kBarrierWeightGradClear = 1;  // the consumers, after clearing rows past a group

template <class Cfg>
struct WeightGradShared {
  GemmSharedStorage<Cfg> gemm;
  SmemGroupTable groups;
};

template <class Cfg>
constexpr int weight_grad_smem_bytes() {
  return static_cast<int>(sizeof(WeightGradShared<Cfg>)) + 1024;
}

// kBf16: the bf16 output (params.out_bf16), else the fp32 one -- one
// epilogue per instantiation, so that neither's registers weigh on the other.
// kBf16Add (with kBf16): each tile's rounded sum added to out_bf16 (gradient
// accumulation), an empty group's left as it is; its own instantiation too
// (a runtime switch made ptxas spill the plain bf16 kernel's accumulators).
template <class Cfg, bool kBf16, bool kBf16Add = false>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    weight_grad_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                       const __grid_constant__ CUtensorMap out_map, const WeightGradParams params) {
  extern __shared__ uint8_t smem_raw[];
  auto& shared = *reinterpret_cast<WeightGradShared<Cfg>*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
  GemmSharedStorage<Cfg>& smem = shared.gemm;
  if (threadIdx.x == 0) {
    StageRing<Cfg::kStages>::init(smem.full, smem.empty, Cfg::kConsumerWarps);
    tma_prefetch_descriptor(&a_map);
    tma_prefetch_descriptor(&b_map);
  }
  const bool table_in_smem =
      stage_group_table<Cfg::kThreads>(shared.groups, params.group_offset, params.group_rows, params.num_groups);
  __syncthreads();

  const int m_tiles = (params.m + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int n_tiles = (params.n + Cfg::kBlockN - 1) / Cfg::kBlockN;
  // Each role makes its own walker after its register reallocation (one
  // made before it was kept across setmaxnreg, and ptxas spilled its table
  // pointer, reloading it at every tile start).
  const auto make_walker = [&] {
    return WeightGradTileWalker<Cfg::kBlockM, Cfg::kBlockN>(
        table_in_smem ? shared.groups.offset : params.group_offset,
        table_in_smem ? shared.groups.rows : params.group_rows, params.num_groups, m_tiles, n_tiles,
        static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
  };
  StageRing<Cfg::kStages> ring{smem.full, smem.empty};
  const int warpgroup = threadIdx.x / 128;
  WeightGradTile tile;

  if (warpgroup == 0) {
    wgmma::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) {
      auto walker = make_walker();
      const GemmTensorMaps maps{&a_map, &b_map};
      while (walker.next(tile)) {
        if constexpr (kBf16Add) prefetch_weight_grad_out_tile<Cfg>(&out_map, tile, params.m);
        load_weight_grad_tile<Cfg>(maps, smem, ring, tile);
      }
    }
  } else {
    wgmma::setmaxnreg_inc<Cfg::kConsumerRegs>();
    // Warp-uniform to ptxas (redux.sync: the value itself), as the
    // descriptors made from it in mma_weight_grad_tile.
    const int consumer = static_cast<int>(__reduce_max_sync(0xffffffffu, static_cast<uint32_t>(warpgroup - 1)));
    auto walker = make_walker();
    float acc[Cfg::kAccRegs];
    HeldStage held;  // the stage the previous tile's store still reads (bf16)
    while (walker.next(tile)) {
      mma_weight_grad_tile<Cfg>(smem, ring, consumer, tile, acc, kBarrierWeightGradClear, held, kBf16);
      const int64_t first = static_cast<int64_t>(tile.group) * params.m * params.n;
      if (kBf16 && held.stage >= 0) {  // a tile with rows: its writes overlap the next tile's K loop
        store_weight_grad_tile_async<Cfg, kBf16Add>(acc, smem, consumer, tile, &out_map, params.m, params.n, held,
                                                    kBarrierWeightGradClear);
      } else if (kBf16) {
        // An empty group's gradient is zeros; accumulating, it adds nothing.
        if constexpr (!kBf16Add) {
          store_empty_weight_grad_tile<Cfg>(consumer, tile, params.out_bf16 + first, params.m, params.n);
        }
      } else {
        store_weight_grad_tile<Cfg>(acc, smem, consumer, tile, params.out + first, params.m, params.n,
                                    params.accumulate != 0);
      }
    }
    // The last tile's writes complete before the CTA exits.
    if (held.stage >= 0 && threadIdx.x % 32 == 0) bulk_wait_all();
  }
}

}  // namespace mok::device
