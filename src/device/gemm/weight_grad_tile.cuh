// One weight-gradient tile, out[m0 .. m0+BM)[n0 .. n0+BN) = sum over the
// group's rows r of a[r][m] * b[r][n], as three device functions a kernel
// calls for its own tasks (the standalone kernel in
// kernel/weight_grad_kernel.cuh; the fused backward's finale later).
//
// Both operands are rows of activations, read transposed: K is the row index,
// so A and B are MN-major in shared memory -- stages of [64 rows][64 columns]
// boxes, 128-byte swizzled, one box per 64 output rows (A) or columns (B) --
// and wgmma reads them with imm-trans-a and imm-trans-b.
//
// K blocks start at the group's first row and step by 64 rows. The last block
// usually runs past the group's end into the next group's rows; the consumers
// zero those rows in shared memory before the block's wgmma, so the sum is
// exactly the group's rows (a zero times a next-group Inf would be a NaN: both
// operands are cleared, not one).
//
// Determinism: each output element is one fp32 chain of m64nBNk16 wgmma over
// the group's rows in order, whatever the tile's position or the grid.
#pragma once

#include <cstdint>

#include "device/gemm/tile_config.cuh"
#include "device/gemm/tile_epilogue.cuh"
#include "device/gemm/tile_mainloop.cuh"
#include "device/pipeline/stage_ring.cuh"
#include "device/ptx/async_copy.cuh"
#include "device/ptx/named_barrier.cuh"
#include "device/ptx/vector_io.cuh"
#include "device/ptx/wgmma.cuh"
#include "device/sched/weight_grad_tiles.cuh"

namespace mok::device {

// Bytes of one [kBlockK rows][64 columns] box of a stage.
template <class Cfg>
inline constexpr int kMNBoxBytes = Cfg::kBlockK * Cfg::kRowBytes;

template <class Cfg>
__device__ __forceinline__ int weight_grad_k_blocks(const WeightGradTile& tile) {
  return (tile.rows + Cfg::kBlockK - 1) / Cfg::kBlockK;
}

// Producer (one thread). Maps: a 2-D {m, rows}, b 2-D {n, rows}, box {64, kBlockK}.
template <class Cfg>
__device__ __forceinline__ void load_weight_grad_tile(const GemmTensorMaps& maps, GemmSharedStorage<Cfg>& smem,
                                                      StageRing<Cfg::kStages>& ring, const WeightGradTile& tile) {
  static_assert(Cfg::kAMajor == OperandMajor::kMN && Cfg::kBMajor == OperandMajor::kMN);
  const int k_blocks = weight_grad_k_blocks<Cfg>(tile);
  for (int kb = 0; kb < k_blocks; ++kb) {
    uint64_t* full = ring.producer_acquire(Cfg::kStageBytes);
    auto& stage = smem.stages[ring.stage];
    const int row = tile.row0 + kb * Cfg::kBlockK;
#pragma unroll
    for (int j = 0; j < Cfg::kBlockM / Cfg::kMNBlock; ++j) {
      tma_load_2d(stage.a + j * kMNBoxBytes<Cfg>, maps.a, full, tile.m0 + j * Cfg::kMNBlock, row);
    }
#pragma unroll
    for (int j = 0; j < Cfg::kBlockN / Cfg::kMNBlock; ++j) {
      tma_load_2d(stage.b + j * kMNBoxBytes<Cfg>, maps.b, full, tile.n0 + j * Cfg::kMNBlock, row);
    }
    ring.advance();
  }
}

// Consumer warpgroup `consumer` clears rows [valid, kBlockK) of its share of
// the stage's boxes (box i goes to consumer i mod warpgroups; the A boxes
// come first). Swizzling permutes 16-byte chunks inside a 128-byte row, so a
// row is still 128 contiguous bytes.
template <class Cfg>
__device__ __forceinline__ void clear_rows_past_group(typename GemmSharedStorage<Cfg>::Stage& stage, int consumer,
                                                      int valid) {
  constexpr int kABoxes = Cfg::kBlockM / Cfg::kMNBlock;
  constexpr int kBoxes = kABoxes + Cfg::kBlockN / Cfg::kMNBlock;
  constexpr int kChunksPerRow = Cfg::kRowBytes / 16;
  const int chunks = (Cfg::kBlockK - valid) * kChunksPerRow;
  const int thread = static_cast<int>(threadIdx.x % 128);
  for (int box = consumer; box < kBoxes; box += Cfg::kConsumerWarpgroups) {
    uint8_t* base = box < kABoxes ? stage.a + box * kMNBoxBytes<Cfg> : stage.b + (box - kABoxes) * kMNBoxBytes<Cfg>;
    base += valid * Cfg::kRowBytes;
    for (int c = thread; c < chunks; c += 128) {
      *reinterpret_cast<uint4*>(base + c * 16) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// Consumer warpgroup `consumer`: acc = the tile's 64 output rows of this
// warpgroup (m0 + 64 * consumer ..) over the group's rows. Every consumer
// warpgroup of the CTA must call it for the same tile (the row clearing ends
// in a barrier among them, id `barrier_id`).
template <class Cfg, class OnStall = TrapOnStall>
__device__ __forceinline__ void mma_weight_grad_tile(GemmSharedStorage<Cfg>& smem, StageRing<Cfg::kStages>& ring,
                                                     int consumer, const WeightGradTile& tile,
                                                     float (&acc)[Cfg::kAccRegs], int barrier_id,
                                                     const OnStall& on_stall = {}) {
  static_assert(Cfg::kElement == ElementType::kBF16, "this build wraps the bf16 wgmma only");
  const int k_blocks = weight_grad_k_blocks<Cfg>(tile);  // 0: acc is not touched (the store writes zeros)
  const bool releaser = (threadIdx.x % 32) == 0;
  int prev_stage = -1;
  for (int kb = 0; kb < k_blocks; ++kb) {
    ring.consumer_wait(on_stall);
    auto& stage = smem.stages[ring.stage];
    const int valid = tile.rows - kb * Cfg::kBlockK;
    if (valid < Cfg::kBlockK) {  // the group's last block: uniform over the CTA's consumers
      clear_rows_past_group<Cfg>(stage, consumer, valid);
      fence_proxy_async_shared();
      named_barrier_sync(barrier_id, 128 * Cfg::kConsumerWarpgroups);
    }
    const uint64_t desc_a = wgmma::smem_desc_mn_sw128(stage.a + consumer * kMNBoxBytes<Cfg>, kMNBoxBytes<Cfg>);
    const uint64_t desc_b = wgmma::smem_desc_mn_sw128(stage.b, kMNBoxBytes<Cfg>);
    wgmma::fence_operands(acc);
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < Cfg::kBlockK / 16; ++k) {
      mma_bf16<Cfg::kBlockN, 1, 1>(acc, wgmma::advance_k_mn(desc_a, 16 * k), wgmma::advance_k_mn(desc_b, 16 * k),
                                   (kb > 0 || k > 0) ? 1u : 0u);
    }
    wgmma::commit_group();
    wgmma::fence_operands(acc);
    wgmma::wait_group<1>();
    if (prev_stage >= 0 && releaser) ring.consumer_release(prev_stage);
    prev_stage = ring.stage;
    ring.advance();
  }
  wgmma::wait_group<0>();
  wgmma::fence_operands(acc);
  if (prev_stage >= 0 && releaser) ring.consumer_release(prev_stage);
}

// Consumer warpgroup `consumer` writes its 64 rows of the tile to out
// ([m][n] row-major: one group's gradient) as fp32, or adds them to what is
// there (accumulate: out = out + acc, one rounding), or -- Out = uint16_t --
// stores them rounded once to bf16. Rows past m and columns past n are not
// written (m and n are multiples of 64). An empty group's tile is zeros, or
// is left as is when accumulating.
//
// Both go through the warp's shared staging so that every global access is
// a whole 128-byte line: straight from the wgmma fragment, a warp's store
// touched 8 rows with 32 bytes each (16 for bf16, half a sector), and a
// tile's 128 such stores per thread took about a third as long as its K
// loop (docs/perf-notes.md b2).
template <class Cfg, class Out>
__device__ __forceinline__ void store_weight_grad_tile(const float (&acc)[Cfg::kAccRegs], GemmSharedStorage<Cfg>& smem,
                                                       int consumer, const WeightGradTile& tile, Out* out, int m,
                                                       int n, bool accumulate) {
  if (tile.m0 + consumer * 64 >= m) return;  // this warpgroup's rows are all past m
  if (accumulate && tile.rows == 0) return;
  const int warp = static_cast<int>(threadIdx.x / 32) % 4;
  const int first_row = tile.m0 + consumer * 64 + warp * 16;
  // An empty group's acc was never written: its tile is zeros. (A select,
  // not a zeroed acc: zeroing it on that path alone made ptxas spill the
  // accumulators around the K loop.)
  const bool empty = tile.rows == 0;
  if constexpr (sizeof(Out) == 2) {
    store_tile_rows_of<Cfg>(
        [&](int j, int h) {
          return empty ? 0u : pack_bf16x2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        },
        smem, consumer, tile.n0, n,
        [&](int i) -> uint16_t* { return out + static_cast<int64_t>(tile.m0 + i) * n; });  // i: row within the tile
  } else {
    // Slabs of 32 fp32 columns: the warp's 16 rows x 128 bytes of staging.
    // Staging row r holds its 16-byte chunks XOR-swizzled by r & 7, so the
    // fragment's writes (8 rows x 32 bytes per instruction) and the read-out
    // (4 rows x 128 bytes) are free of bank conflicts.
    const int lane = static_cast<int>(threadIdx.x % 32);
    const uint32_t base = shared_address(smem.staging[consumer * 4 + warp]);
    const int frag_row = lane / 4;
    const int c = lane & 7;  // read-out: the 16-byte chunk (4 columns) this lane moves
#pragma unroll
    for (int slab = 0; slab < Cfg::kBlockN / 32; ++slab) {
      const int c0 = tile.n0 + slab * 32;
      if (c0 >= n) break;  // warp-uniform
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {  // the slab's 8-column chunks
        const int j = slab * 4 + jj;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = frag_row + 8 * h;
          const int chunk = 2 * jj + (lane % 4) / 2;
          const float x = empty ? 0.0f : acc[4 * j + 2 * h], y = empty ? 0.0f : acc[4 * j + 2 * h + 1];
          st_shared_v2(base + r * 128 + ((chunk ^ (r & 7)) * 16) + (lane % 2) * 8, x, y);
        }
      }
      __syncwarp();
      uint4 v[4];
#pragma unroll
      for (int it = 0; it < 4; ++it) {
        const int r = it * 4 + (lane >> 3);
        v[it] = ld_shared_v4(base + r * 128 + ((c ^ (r & 7)) * 16));
      }
      __syncwarp();  // every lane's reads precede the next slab's writes
      Out* const dst = out + static_cast<int64_t>(first_row) * n + c0 + c * 4;
      if (accumulate) {  // all four old lines in flight at once, then one addition each
        uint4 old[4];
#pragma unroll
        for (int it = 0; it < 4; ++it) old[it] = ld_global_v4(dst + static_cast<int64_t>(it * 4 + (lane >> 3)) * n);
#pragma unroll
        for (int it = 0; it < 4; ++it) {
          v[it] = make_uint4(__float_as_uint(__fadd_rn(__uint_as_float(old[it].x), __uint_as_float(v[it].x))),
                             __float_as_uint(__fadd_rn(__uint_as_float(old[it].y), __uint_as_float(v[it].y))),
                             __float_as_uint(__fadd_rn(__uint_as_float(old[it].z), __uint_as_float(v[it].z))),
                             __float_as_uint(__fadd_rn(__uint_as_float(old[it].w), __uint_as_float(v[it].w))));
        }
      }
#pragma unroll
      for (int it = 0; it < 4; ++it) st_global_v4(dst + static_cast<int64_t>(it * 4 + (lane >> 3)) * n, v[it]);
    }
  }
}

}  // namespace mok::device
