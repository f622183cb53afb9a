// The standalone persistent grouped-GEMM kernel: setup, then one branch per
// warpgroup role. Warpgroup 0 is the producer (one thread issues TMA, few
// registers); warpgroups 1.. are consumers (wgmma + epilogue, many
// registers). All roles walk the same task list (sched/grouped_tiles.cuh).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "device/gemm/fp8_mainloop.cuh"
#include "device/gemm/tile_config.cuh"
#include "device/gemm/tile_epilogue.cuh"
#include "device/gemm/tile_epilogue_swiglu_backward.cuh"
#include "device/gemm/tile_epilogue_swiglu_quantize.cuh"
#include "device/gemm/tile_mainloop.cuh"
#include "device/pipeline/stage_ring.cuh"
#include "device/ptx/async_copy.cuh"
#include "device/ptx/cluster.cuh"
#include "device/ptx/wgmma.cuh"
#include "device/sched/group_table.cuh"
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
  SwigluBackwardOutputs swiglu_backward;  // kSwiGLUBackward's extra inputs and outputs (out is unused)
  Fp8Scales fp8;                          // e4m3 operands' scales
  uint8_t* out_scales;                    // kSwiGLUQuantize: ue8m0 [m_total, n_cols / 128] (out holds e4m3 bytes)
};

// Named barriers of this kernel (0 is __syncthreads).
inline constexpr int kBarrierGemmExchange = 1;  // the split-N gate/up tile's two consumer warpgroups

// The grouped GEMM's shared memory: the tile pipeline plus the group table
// (as the weight-gradient kernel's; the fused kernel's tasks know their
// expert).
template <class Cfg>
struct GroupedGemmShared {
  GemmSharedStorage<Cfg> gemm;
  SmemGroupTable groups;
  // The split-N gate/up tile's exchange between the consumer warpgroups (4
  // floats elsewhere, the plain split-N tile included: no zero-size arrays).
  alignas(16) float exchange[Cfg::kExchangeFloats > 0 ? Cfg::kExchangeFloats : 4];
};

// Dynamic shared memory to request: the storage plus slack to align it.
template <class Cfg>
constexpr int grouped_gemm_smem_bytes() {
  return static_cast<int>(sizeof(GroupedGemmShared<Cfg>)) + 1024;
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                        const __grid_constant__ CUtensorMap b_map, const GroupedGemmParams params) {
  extern __shared__ uint8_t smem_raw[];
  auto& shared = *reinterpret_cast<GroupedGemmShared<Cfg>*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
  GemmSharedStorage<Cfg>& smem = shared.gemm;

  if (threadIdx.x == 0) {
    // With A multicast a stage is free once the consumer warps of both CTAs released it.
    StageRing<Cfg::kStages>::init(smem.full, smem.empty, Cfg::kConsumerWarps * Cfg::kClusterN);
    tma_prefetch_descriptor(&a_map);
    tma_prefetch_descriptor(&b_map);
  }
  const bool table_in_smem =
      stage_group_table<Cfg::kThreads>(shared.groups, params.group_offset, params.group_rows, params.num_groups);
  __syncthreads();
  // The peer's barriers must be initialised before this CTA multicasts into
  // its stages or arrives on them.
  if constexpr (Cfg::kClusterN > 1) cluster_sync();

  const GemmTensorMaps maps{&a_map, &b_map};
  // A cluster walks tiles kClusterN n-tiles wide; its CTA r takes the r-th
  // (the host guarantees n is a multiple of that width).
  GroupedTileWalker<Cfg::kBlockM, Cfg::kOutCols * Cfg::kClusterN> walker{
      table_in_smem ? shared.groups.offset : params.group_offset,
      table_in_smem ? shared.groups.rows : params.group_rows,
      params.num_groups,
      (params.n_cols + Cfg::kOutCols * Cfg::kClusterN - 1) / (Cfg::kOutCols * Cfg::kClusterN),
      params.band,
      params.m_total,
      static_cast<int>(blockIdx.x) / Cfg::kClusterN,
      static_cast<int>(gridDim.x) / Cfg::kClusterN};
  const int n_shift = Cfg::kClusterN > 1 ? static_cast<int>(cluster_rank()) * Cfg::kOutCols : 0;
  StageRing<Cfg::kStages> ring{smem.full, smem.empty};
  const int k_blocks = params.k / Cfg::kBlockK;
  const int warpgroup = threadIdx.x / 128;

  if (warpgroup == 0) {
    wgmma::setmaxnreg_dec<Cfg::kProducerRegs>();
    if constexpr (Cfg::kEpilogue == EpilogueKind::kSwiGLUBackward) {
      // The whole first warp walks the tiles: lane 0 loads each, then every
      // lane prefetches a share of its epilogue's inputs. When load_tile
      // returns, the consumers are at most kStages k-blocks from the end of
      // that tile's K loop: early enough for DRAM, late enough that the
      // operands streaming through L2 meanwhile do not evict them.
      if (threadIdx.x < 32) {
        const int lane = static_cast<int>(threadIdx.x);
        GemmTile tile;
        while (walker.next(tile)) {
          tile.n0 += n_shift;
          if (lane == 0) load_tile<Cfg>(maps, smem, ring, tile, k_blocks);
          __syncwarp();
          prefetch_swiglu_backward_inputs<Cfg>(tile, params.swiglu_backward, lane);
        }
      }
    } else if (threadIdx.x == 0) {
      GemmTile tile;
      while (walker.next(tile)) {
        tile.n0 += n_shift;
        load_tile<Cfg>(maps, smem, ring, tile, k_blocks);
      }
    }
  } else {
    wgmma::setmaxnreg_inc<Cfg::kConsumerRegs>();
    const int consumer = warpgroup - 1;
    float acc[Cfg::kAccRegs];
    GemmTile tile;
    while (walker.next(tile)) {
      tile.n0 += n_shift;
      if constexpr (Cfg::kElement == ElementType::kE4M3) {
        mma_fp8_tile<Cfg>(smem, ring, consumer, tile, params.fp8, acc);
      } else {
        mma_tile<Cfg>(smem, ring, consumer, k_blocks, acc);
      }
      if constexpr (Cfg::kEpilogue == EpilogueKind::kSwiGLUBackward) {
        store_swiglu_backward_tile<Cfg>(acc, smem, consumer, tile, params.swiglu_backward);
      } else if constexpr (Cfg::kEpilogue == EpilogueKind::kSwiGLUQuantize) {
        store_swiglu_quantize_tile<Cfg>(acc, smem, shared.exchange, consumer, tile,
                                        reinterpret_cast<uint8_t*>(params.out),
                                        row_major_scales(params.out_scales, tile, params.n_cols), params.n_cols,
                                        kBarrierGemmExchange);
      } else {  // plain or SwiGLU; a split-N plain tile's warpgroups store 128 columns each
        store_tile<Cfg>(acc, smem, consumer, tile, params.out, params.n_cols);
      }
    }
  }
  // No multicast into this CTA's stages and no arrival on its barriers may
  // come after it exits: every thread of both CTAs meets here first.
  if constexpr (Cfg::kClusterN > 1) cluster_sync();
}

}  // namespace mok::device
