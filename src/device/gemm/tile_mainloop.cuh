// The two halves of one tile's K loop: the producer's TMA loads and the
// consumer warpgroups' wgmma. Both are plain device functions of (operands,
// shared storage, ring cursor, task) so a megakernel can call them for its own
// tasks; the persistent grouped-GEMM kernel is one such caller.
//
// Determinism: every output element is the same sequence of
// m64n{BN}k16 wgmma over k = 0, 16, 32, ... K-16, first one with D
// overwritten, whatever the tile's position, the group or the grid size.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "device/gemm/tile_config.cuh"
#include "device/pipeline/stage_ring.cuh"
#include "device/ptx/async_copy.cuh"
#include "device/ptx/cluster.cuh"
#include "device/ptx/wgmma.cuh"
#include "device/sched/grouped_tiles.cuh"

namespace mok::device {

// Tensor maps of one grouped GEMM (__grid_constant__ kernel parameters).
//   a: 2-D {K, M_total}, box {64, BM}
//   b: plain  3-D {K, N, G},    box {64, BN, 1}
//      SwiGLU 4-D {K, N, 2, G}, box {64, BN/2, 1, 1} (w13 viewed as [G][2][N][K])
//      MN-major plain 3-D {N, K, G}, box {64, 64, 1} (B as [G][K][N]), BN/64 boxes a stage
struct GemmTensorMaps {
  const CUtensorMap* a;
  const CUtensorMap* b;
};

// What a stage carries besides its A and B boxes: nothing, or Extra::kBytes
// more, copied by `extra(kb, stage, full)` onto the stage's full barrier (the
// fused FP8 forward's A scales, gemm/fp8_stage_scales.cuh).
struct NoStageExtra {
  static constexpr uint32_t kBytes = 0;
  __device__ __forceinline__ void operator()(int, int, uint64_t*) const {}
};

// A stage's B read k-by-n (B as [G][K][N]): BN / kMNBlock boxes of
// [kBlockK rows][kMNBlock columns] of group `group`, columns from n0.
template <class Cfg>
__device__ __forceinline__ void load_b_kn_boxes(uint8_t* dst, const void* map, uint64_t* full, int n0, int k0,
                                                int group) {
#pragma unroll
  for (int j = 0; j < Cfg::kBlockN / Cfg::kMNBlock; ++j) {
    tma_load_3d(dst + j * Cfg::kBlockK * Cfg::kRowBytes, map, full, n0 + j * Cfg::kMNBlock, k0, group);
  }
}

// Producer (one thread): stream the tile's k_blocks stages into the ring.
template <class Cfg, class Extra = NoStageExtra>
__device__ __forceinline__ void load_tile(const GemmTensorMaps& maps, GemmSharedStorage<Cfg>& smem,
                                          StageRing<Cfg::kStages>& ring, const GemmTile& tile,
                                          int k_blocks, Extra extra = {}) {
  for (int kb = 0; kb < k_blocks; ++kb) {
    uint64_t* full = ring.producer_acquire(Cfg::kStageBytes + Extra::kBytes);
    if constexpr (Extra::kBytes > 0) extra(kb, ring.stage, full);
    auto& stage = smem.stages[ring.stage];
    const int k0 = kb * Cfg::kBlockK;
    if constexpr (Cfg::kClusterN == 2) {
      // This CTA's half of the A rows, into both CTAs' stage (the peer sends
      // the other half); the A map's box is BM / 2 rows.
      const uint32_t half = cluster_rank();
      constexpr int kHalfRows = Cfg::kBlockM / 2;
      tma_load_2d_multicast(stage.a + half * kHalfRows * Cfg::kRowBytes, maps.a, full, k0,
                            tile.row0 + static_cast<int>(half) * kHalfRows, 0b11);
    } else {
      tma_load_2d(stage.a, maps.a, full, k0, tile.row0);
    }
    if constexpr (Cfg::kBMajor == OperandMajor::kMN) {
      load_b_kn_boxes<Cfg>(stage.b, maps.b, full, tile.n0, k0, tile.group);
    } else if constexpr (Cfg::kGateUp) {
      constexpr int kHalf = Cfg::kBlockN / 2;
      tma_load_4d(stage.b, maps.b, full, k0, tile.n0, 0, tile.group);                   // gate rows
      tma_load_4d(stage.b + kHalf * Cfg::kRowBytes, maps.b, full, k0, tile.n0, 1, tile.group);  // up rows
    } else {
      tma_load_3d(stage.b, maps.b, full, k0, tile.n0, tile.group);
    }
    ring.advance();
  }
}

template <int kN, int kTransB, int kTransA = 0>
__device__ __forceinline__ void mma_bf16(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b,
                                         uint32_t accumulate) {
  if constexpr (kN == 256) {
    wgmma::mma_m64n256k16<kTransB, kTransA>(d, desc_a, desc_b, accumulate);
  } else {
    wgmma::mma_m64n128k16<kTransB, kTransA>(d, desc_a, desc_b, accumulate);
  }
}

// The descriptor of a stage's B operand, and of its k16 step k.
template <class Cfg>
__device__ __forceinline__ uint64_t b_descriptor(const uint8_t* b) {
  if constexpr (Cfg::kBMajor == OperandMajor::kMN) {
    return wgmma::smem_desc_mn_sw128(b, Cfg::kBlockK * Cfg::kRowBytes);
  } else {
    return wgmma::smem_desc_k_sw128(b);
  }
}
template <class Cfg>
__device__ __forceinline__ uint64_t b_descriptor_at(uint64_t desc, int k) {
  if constexpr (Cfg::kBMajor == OperandMajor::kMN) {
    return wgmma::advance_k_mn(desc, 16 * k);
  } else {
    return wgmma::advance_k(desc, 16 * k);
  }
}

// Consumer warpgroup `consumer` (all 128 threads): acc = A[64 rows of this
// warpgroup] x B[BN rows]^T over the whole K. One wgmma group stays in
// flight while the next stage is awaited; a stage is handed back as soon as
// the group that read it has retired. `on_stall`: what a stage wait that
// never ends does (async_copy.cuh). With `keep_last`, the last k-block's
// stage is not handed back: it is returned (else -1) for the tile's output
// to go through it by TMA (the caller hands it back once the store has read
// it: tile_store_async.cuh's held stage). `after_block(kb)` runs once k-block
// kb is issued (the caller hands back an earlier tile's held stage there).
struct NoAfterBlock {
  __device__ __forceinline__ void operator()(int) const {}
};
template <class Cfg, class OnStall = TrapOnStall, class AfterBlock = NoAfterBlock>
__device__ __forceinline__ int mma_tile(GemmSharedStorage<Cfg>& smem, StageRing<Cfg::kStages>& ring, int consumer,
                                        int k_blocks, float (&acc)[Cfg::kAccRegs], const OnStall& on_stall = {},
                                        bool keep_last = false, const AfterBlock& after_block = {}) {
  static_assert(Cfg::kElement == ElementType::kBF16, "this build wraps the bf16 wgmma only");
  const bool releaser = (threadIdx.x % 32) == 0;  // one arrival per consumer warp
  int prev_stage = -1;
  for (int kb = 0; kb < k_blocks; ++kb) {
    ring.consumer_wait(on_stall);
    auto& stage = smem.stages[ring.stage];
    const uint64_t desc_a = wgmma::smem_desc_k_sw128(stage.a + consumer * 64 * Cfg::kRowBytes);
    const uint64_t desc_b = b_descriptor<Cfg>(stage.b);
    wgmma::fence_operands(acc);
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < Cfg::kBlockK / 16; ++k) {
      mma_bf16<Cfg::kBlockN, Cfg::kBMajor == OperandMajor::kMN ? 1 : 0>(
          acc, wgmma::advance_k(desc_a, 16 * k), b_descriptor_at<Cfg>(desc_b, k), (kb > 0 || k > 0) ? 1u : 0u);
    }
    wgmma::commit_group();
    wgmma::fence_operands(acc);
    wgmma::wait_group<1>();
    if (prev_stage >= 0 && releaser) ring.consumer_release(prev_stage);
    prev_stage = ring.stage;
    ring.advance();
    after_block(kb);
  }
  wgmma::wait_group<0>();
  wgmma::fence_operands(acc);
  if (keep_last) return prev_stage;
  if (prev_stage >= 0 && releaser) ring.consumer_release(prev_stage);
  return -1;
}

// A consumer warpgroup with no real rows in the tile (its 64 rows are all
// padding): it only keeps the stage ring flowing -- waits for each stage and
// hands it back -- while the other warpgroup computes. The stage is reused
// only once every consumer warp has released it, so the early release here
// never frees a stage the other warpgroup still reads; and with one
// warpgroup issuing wgmma the tensor cores serve it alone. `keep_last`: as
// mma_tile's (both warpgroups keep the same stage), and so is `after_block`.
template <class Cfg, class OnStall = TrapOnStall, class AfterBlock = NoAfterBlock>
__device__ __forceinline__ int skip_tile(StageRing<Cfg::kStages>& ring, int k_blocks, const OnStall& on_stall = {},
                                         bool keep_last = false, const AfterBlock& after_block = {}) {
  const bool releaser = (threadIdx.x % 32) == 0;
  int last = -1;
  for (int kb = 0; kb < k_blocks; ++kb) {
    ring.consumer_wait(on_stall);
    last = ring.stage;
    if (releaser && !(keep_last && kb == k_blocks - 1)) ring.consumer_release(ring.stage);
    ring.advance();
    after_block(kb);
  }
  return keep_last ? last : -1;
}

}  // namespace mok::device
