// The standalone persistent grouped-GEMM kernel: setup, then one branch per
// warpgroup role. Warpgroup 0 is the producer (one thread issues TMA, few
// registers); warpgroups 1.. are consumers (wgmma + epilogue, many
// registers). All roles walk the same task list (sched/grouped_tiles.cuh).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "device/gemm/tile_config.cuh"
#include "device/gemm/tile_epilogue.cuh"
#include "device/gemm/tile_mainloop.cuh"
#include "device/pipeline/stage_ring.cuh"
#include "device/ptx/async_copy.cuh"
#include "device/ptx/wgmma.cuh"
#include "device/sched/grouped_tiles.cuh"

namespace mok::device {

struct GroupedGemmParams {
  uint16_t* out;                // bf16 [m_total, n_cols]
  const int32_t* group_offset;  // [num_groups + 1]
  const int32_t* group_rows;    // [num_groups]
  int num_groups;
  int m_total;
  int n_cols;  // output columns N
  int k;       // reduction length K
  int band;    // row tiles per raster band (sched/grouped_tiles.cuh)
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                        const __grid_constant__ CUtensorMap b_map, const GroupedGemmParams params) {
  extern __shared__ uint8_t smem_raw[];
  auto& smem = *reinterpret_cast<GemmSharedStorage<Cfg>*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));

  if (threadIdx.x == 0) {
    StageRing<Cfg::kStages>::init(smem.full, smem.empty, Cfg::kConsumerWarps);
    tma_prefetch_descriptor(&a_map);
    tma_prefetch_descriptor(&b_map);
  }
  // Group counts: a shared-memory copy keeps global-load latency out of the
  // consumers' path between tiles.
  const bool counts_in_smem = params.num_groups <= Cfg::kSmemGroups;
  if (counts_in_smem) {
    for (int g = threadIdx.x; g < params.num_groups; g += Cfg::kThreads) {
      smem.group_rows[g] = params.group_rows[g];
      smem.group_offset[g] = params.group_offset[g];
    }
  }
  __syncthreads();

  const GemmTensorMaps maps{&a_map, &b_map};
  GroupedTileWalker<Cfg::kBlockM, Cfg::kOutCols> walker{
      counts_in_smem ? smem.group_offset : params.group_offset,
      counts_in_smem ? smem.group_rows : params.group_rows,
      params.num_groups,
      (params.n_cols + Cfg::kOutCols - 1) / Cfg::kOutCols,
      params.band,
      params.m_total,
      static_cast<int>(blockIdx.x),
      static_cast<int>(gridDim.x)};
  StageRing<Cfg::kStages> ring{smem.full, smem.empty};
  const int k_blocks = params.k / Cfg::kBlockK;
  const int warpgroup = threadIdx.x / 128;

  if (warpgroup == 0) {
    wgmma::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) {
      GemmTile tile;
      while (walker.next(tile)) load_tile<Cfg>(maps, smem, ring, tile, k_blocks);
    }
  } else {
    wgmma::setmaxnreg_inc<Cfg::kConsumerRegs>();
    const int consumer = warpgroup - 1;
    float acc[Cfg::kAccRegs];
    GemmTile tile;
    while (walker.next(tile)) {
      mma_tile<Cfg>(smem, ring, consumer, k_blocks, acc);
      store_tile<Cfg>(acc, smem, consumer, tile, params.out, params.n_cols);
    }
  }
}

}  // namespace mok::device
