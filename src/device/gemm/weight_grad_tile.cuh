// One weight-gradient tile, out[m0 .. m0+BM)[n0 .. n0+BN) = sum over the
// group's rows r of a[r][m] * b[r][n], as device functions a kernel calls for
// its own tasks (the standalone kernel in kernel/weight_grad_kernel.cuh; the
// fused backward's finale, roles/gemm_consumer.cuh): load, K loop, and a
// store from registers (fp32, accumulate, bf16) or, for bf16, by TMA from
// shared memory during the next tile's K loop.
//
// Both operands are rows of activations, read transposed: K is the row index,
// so A and B are MN-major in shared memory -- stages of [64 rows][64 columns]
// boxes, 128-byte swizzled, one box per 64 output rows (A) or columns (B) --
// and wgmma reads them with imm-trans-a and imm-trans-b.
//
// K blocks start at the group's first row and step by 64 rows. The last block
// usually runs past the group's end into the next group's rows; its k16 steps
// past the group are not issued, and the consumers zero the rows past the
// group in its last issued step in shared memory before the block's wgmma, so
// the sum is exactly the group's rows (a zero times a next-group Inf would be
// a NaN: both operands are cleared, not one).
//
// Determinism: each output element is one fp32 chain of m64nBNk16 wgmma over
// the group's rows in order, whatever the tile's position or the grid.
#pragma once

#include <cstdint>
#include <type_traits>

#include "device/gemm/tile_config.cuh"
#include "device/gemm/tile_epilogue.cuh"
#include "device/gemm/tile_mainloop.cuh"
#include "device/gemm/tile_store_async.cuh"
#include "device/pipeline/stage_ring.cuh"
#include "device/ptx/async_copy.cuh"
#include "device/ptx/bulk_copy.cuh"
#include "device/ptx/named_barrier.cuh"
#include "device/ptx/stmatrix.cuh"
#include "device/ptx/vector_io.cuh"
#include "device/ptx/wgmma.cuh"
#include "device/sched/weight_grad_tiles.cuh"

namespace mok::device {

// Bytes of one [kBlockK rows][64 columns] box of a stage.
template <class Cfg>
inline constexpr int kMNBoxBytes = Cfg::kBlockK * Cfg::kRowBytes;

// K blocks of a tile over `rows` group rows (the last one partial).
template <class Cfg>
__device__ __forceinline__ int weight_grad_k_blocks(int rows) {
  return (rows + Cfg::kBlockK - 1) / Cfg::kBlockK;
}
template <class Cfg>
__device__ __forceinline__ int weight_grad_k_blocks(const WeightGradTile& tile) {
  return weight_grad_k_blocks<Cfg>(tile.rows);
}

// One stage's whole boxes of an MN-major operand: kCols / 64 boxes of
// [kBlockK rows][64 columns], columns from c0, rows from `row`.
template <class Cfg, int kCols>
__device__ __forceinline__ void load_mn_boxes(uint8_t* dst, const void* map, uint64_t* full, int c0, int row) {
#pragma unroll
  for (int j = 0; j < kCols / Cfg::kMNBlock; ++j) {
    tma_load_2d(dst + j * kMNBoxBytes<Cfg>, map, full, c0 + j * Cfg::kMNBlock, row);
  }
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
    load_mn_boxes<Cfg, Cfg::kBlockM>(stage.a, maps.a, full, tile.m0, row);
    load_mn_boxes<Cfg, Cfg::kBlockN>(stage.b, maps.b, full, tile.n0, row);
    ring.advance();
  }
}

// Producer, accumulating bf16 kernel: the tile's old output values brought
// into L2 when its loads begin, a tile's K loop before its TMA additions read
// them, so that the additions (read, add, write at L2) do not wait on DRAM
// while the stage they store from is held. Measured on the DeepSeek-V3
// slice, the addition's cost over a plain store fell from ~3% to ~2.4%
// (dW13) and ~0.5% (dW2) (docs/perf-notes.md v24). Only a hint: no bit
// depends on it. out_map: bf16 {n, groups x m}, box {64, 64}; rows past m
// (m is a multiple of 64) are left out, columns past n are the map's edge.
template <class Cfg>
__device__ __forceinline__ void prefetch_weight_grad_out_tile(const void* out_map, const WeightGradTile& tile, int m) {
  if (tile.rows == 0) return;  // an empty group's tile is not added to
#pragma unroll
  for (int r = 0; r < Cfg::kBlockM; r += 64) {
    if (tile.m0 + r >= m) break;
#pragma unroll
    for (int c = 0; c < Cfg::kBlockN; c += 64) tma_prefetch_l2_2d(out_map, tile.n0 + c, tile.group * m + tile.m0 + r);
  }
}

// Consumer warpgroup `consumer` clears rows [valid, end) of its share of
// the stage's boxes (box i goes to consumer i mod warpgroups; the A boxes
// come first). Swizzling permutes 16-byte chunks inside a 128-byte row, so a
// row is still 128 contiguous bytes.
template <class Cfg>
__device__ __forceinline__ void clear_rows_past_group(typename GemmSharedStorage<Cfg>::Stage& stage, int consumer,
                                                      int valid, int end) {
  constexpr int kABoxes = Cfg::kBlockM / Cfg::kMNBlock;
  constexpr int kBoxes = kABoxes + Cfg::kBlockN / Cfg::kMNBlock;
  constexpr int kChunksPerRow = Cfg::kRowBytes / 16;
  const int chunks = (end - valid) * kChunksPerRow;
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
//
// `held`: a stage the previous tile's asynchronous store still reads. It is
// handed back after this tile's second k-block is issued (or at the end of a
// shorter tile): by then the store has had a k-block's time to drain, and
// the producer still has a k-block's time to refill the stage before the
// K loop needs it (it is the fourth stage from here). With `keep_last`, the
// stage of this tile's last k-block is not handed back but becomes `held`:
// the tile's output goes through it (store_weight_grad_tile_async). An
// empty group's tile (no k-blocks) holds nothing.
template <class Cfg, class OnStall = TrapOnStall>
__device__ __forceinline__ void mma_weight_grad_tile(GemmSharedStorage<Cfg>& smem, StageRing<Cfg::kStages>& ring,
                                                     int consumer, const WeightGradTile& tile,
                                                     float (&acc)[Cfg::kAccRegs], int barrier_id, HeldStage& held,
                                                     bool keep_last, const OnStall& on_stall = {}) {
  static_assert(Cfg::kElement == ElementType::kBF16, "this build wraps the bf16 wgmma only");
  // The group's rows through redux.sync (a warp-uniform value's maximum is
  // itself), so that ptxas keeps the trip count, the tail's cases and the
  // ring's cursor uniform, and with them the descriptors below.
  const int rows = static_cast<int>(__reduce_max_sync(0xffffffffu, static_cast<uint32_t>(tile.rows)));
  const int k_blocks = weight_grad_k_blocks<Cfg>(rows);  // 0: acc is not touched (the store writes zeros)
  const bool releaser = (threadIdx.x % 32) == 0;
  int prev_stage = -1;
  // Stage 0's descriptors, made once; a stage's are theirs moved by whole
  // stages and a k16 step's by 16 rows of 128 bytes, in the low word only
  // (shared addresses are below 2^18, so the 14-bit start field never
  // carries into the next): the same descriptors as built from each stage's
  // address. A k-block's are made before its stage wait, so that from the
  // wait to its first wgmma only the issue remains.
  constexpr uint32_t kStageStep = static_cast<uint32_t>(sizeof(smem.stages[0]) >> 4);
  constexpr uint32_t kStepK16 = (16 * 128) >> 4;
  const uint64_t a_stage0 =
      wgmma::smem_desc_mn_sw128(smem.stages[0].a + consumer * kMNBoxBytes<Cfg>, kMNBoxBytes<Cfg>);
  const uint64_t b_stage0 = wgmma::smem_desc_mn_sw128(smem.stages[0].b, kMNBoxBytes<Cfg>);
  const uint64_t a_hi = a_stage0 & 0xffffffff00000000ull, b_hi = b_stage0 & 0xffffffff00000000ull;
  uint32_t a_lo = 0, b_lo = 0;  // the current k-block's, set before its wait
  // One k-block of kSteps k16 wgmma (the stage's first kSteps * 16 rows).
  const auto block = [&](auto steps, int kb) {
    constexpr int kSteps = decltype(steps)::value;
    wgmma::fence_operands(acc);
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
      mma_bf16<Cfg::kBlockN, 1, 1>(acc, a_hi | (a_lo + kStepK16 * k), b_hi | (b_lo + kStepK16 * k),
                                   (kb > 0 || k > 0) ? 1u : 0u);
    }
    wgmma::commit_group();
    wgmma::fence_operands(acc);
    wgmma::wait_group<1>();
    if (prev_stage >= 0 && releaser) ring.consumer_release(prev_stage);
    prev_stage = ring.stage;
    ring.advance();
    if (kb == 1) release_held_stage(ring, held);
  };
  constexpr int kStepsPerBlock = Cfg::kBlockK / 16;
  static_assert(kStepsPerBlock == 4, "the tail's cases below are written for kBlockK 64");
  for (int kb = 0; kb < k_blocks; ++kb) {
    const uint32_t step = static_cast<uint32_t>(ring.stage) * kStageStep;
    a_lo = static_cast<uint32_t>(a_stage0) + step;
    b_lo = static_cast<uint32_t>(b_stage0) + step;
    const int valid = rows - kb * Cfg::kBlockK;
    ring.consumer_wait(on_stall);
    if (valid >= Cfg::kBlockK) {
      block(std::integral_constant<int, kStepsPerBlock>{}, kb);
      continue;
    }
    // The group's last block, `valid` < kBlockK rows: only the k16 steps
    // that hold real rows are issued (the others would only add zeros), and
    // the rows past `valid` in the last of them are zeroed first. The step
    // count is made warp-uniform (a shuffle from lane 0) so that ptxas sees
    // the branches below as uniform and keeps the wgmma pipelined.
    const int steps = __shfl_sync(0xffffffffu, (valid + 15) / 16, 0);
    clear_rows_past_group<Cfg>(smem.stages[ring.stage], consumer, valid, steps * 16);
    fence_proxy_async_shared();
    named_barrier_sync(barrier_id, 128 * Cfg::kConsumerWarpgroups);
    if (steps == 1) {
      block(std::integral_constant<int, 1>{}, kb);
    } else if (steps == 2) {
      block(std::integral_constant<int, 2>{}, kb);
    } else if (steps == 3) {
      block(std::integral_constant<int, 3>{}, kb);
    } else {
      block(std::integral_constant<int, 4>{}, kb);
    }
  }
  if (held.stage >= 0) {  // a tile of fewer than two k-blocks
    release_held_stage(ring, held);
    // An empty tile is stored from registers through the staging area, which
    // the other warps' stores may still read until each has released.
    if (k_blocks == 0) named_barrier_sync(barrier_id, 128 * Cfg::kConsumerWarpgroups);
  }
  wgmma::wait_group<0>();
  wgmma::fence_operands(acc);
  if (keep_last && prev_stage >= 0) {
    held.stage = prev_stage;
  } else if (prev_stage >= 0 && releaser) {
    ring.consumer_release(prev_stage);
  }
}

// Consumer warpgroup `consumer` writes its 64 rows of the tile to out
// ([m][n] row-major: one group's gradient) as fp32, or adds them to what is
// there (accumulate: out = out + acc, one rounding). Rows past m and columns
// past n are not written (m and n are multiples of 64). An empty group's
// tile is zeros, or is left as is when accumulating. (bf16 tiles go by TMA:
// store_weight_grad_tile_async, or store_empty_weight_grad_tile.)
//
// It goes through the warp's shared staging so that every global access is
// a whole 128-byte line: straight from the wgmma fragment, a warp's store
// touched 8 rows with 32 bytes each, and a tile's 128 such stores per thread
// took about a third as long as its K loop (docs/perf-notes.md b2).
template <class Cfg>
__device__ __forceinline__ void store_weight_grad_tile(const float (&acc)[Cfg::kAccRegs], GemmSharedStorage<Cfg>& smem,
                                                       int consumer, const WeightGradTile& tile, float* out, int m,
                                                       int n, bool accumulate) {
  if (tile.m0 + consumer * 64 >= m) return;  // this warpgroup's rows are all past m
  if (accumulate && tile.rows == 0) return;
  const int warp = static_cast<int>(threadIdx.x / 32) % 4;
  const int first_row = tile.m0 + consumer * 64 + warp * 16;
  // An empty group's acc was never written: its tile is zeros. (A select,
  // not a zeroed acc: zeroing it on that path alone made ptxas spill the
  // accumulators around the K loop.)
  const bool empty = tile.rows == 0;
  {
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
      float* const dst = out + static_cast<int64_t>(first_row) * n + c0 + c * 4;
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

// An empty group's bf16 tile (its acc was never written): zeros, from no
// registers but the zero, each warp its 16 rows in whole 128-byte lines.
// `out`: the group's [m][n] gradient.
template <class Cfg>
__device__ __forceinline__ void store_empty_weight_grad_tile(int consumer, const WeightGradTile& tile, uint16_t* out,
                                                             int m, int n) {
  if (tile.m0 + consumer * 64 >= m) return;
  const int warp = static_cast<int>(threadIdx.x / 32) % 4;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int chunks_per_row = min(Cfg::kBlockN, n - tile.n0) / 8;  // 16 bytes = 8 bf16
  uint16_t* const first = out + static_cast<int64_t>(tile.m0 + consumer * 64 + warp * 16) * n + tile.n0;
  for (int i = lane; i < 16 * chunks_per_row; i += 32) {
    st_global_v4(first + static_cast<int64_t>(i / chunks_per_row) * n + (i % chunks_per_row) * 8,
                 make_uint4(0u, 0u, 0u, 0u));
  }
}

// The bf16 tile through shared memory and TMA (store_tile_boxes_async), so
// that its global writes run during the next tile's K loop instead of before
// it (with stores from registers, about an eighth of a DeepSeek-V3 tile's
// time: docs/perf-notes.md b6). out_map: bf16 {n, groups x m}, box {64, 64};
// rows past m are not stored (m is a multiple of 64: a warpgroup's rows are
// all in or all out). The rounding and the bits are store_weight_grad_tile's;
// kAccumulate: the rounded tile is added to out's bf16 values by the TMA unit
// (one more rounding: out + tile, as torch adds one bf16 gradient to another).
template <class Cfg, bool kAccumulate = false>
__device__ __forceinline__ void store_weight_grad_tile_async(const float (&acc)[Cfg::kAccRegs],
                                                             GemmSharedStorage<Cfg>& smem, int consumer,
                                                             const WeightGradTile& tile, const void* out_map, int m,
                                                             int n, const HeldStage& held, int barrier_id) {
  store_tile_boxes_async<Cfg, kAccumulate>(acc, smem, consumer, out_map, tile.n0,
                                           tile.group * m + tile.m0 + consumer * 64, n, tile.m0 + consumer * 64 < m,
                                           held, barrier_id);
}

}  // namespace mok::device
