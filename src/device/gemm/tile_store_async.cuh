// A 128 x 256 bf16 output tile stored by TMA from shared memory, so that its
// global writes leave the SM asynchronously: the consumers' warps go on to
// the next task while the TMA unit reads the tile, instead of queueing 64 KB
// of 16-byte stores ahead of their next barrier operation (docs/perf-notes.md
// v12). Shared memory has no room for a tile of its own beside the four
// stages, so the tile goes through the last stage of its K loop, kept back
// from the producer (the held stage), and the consumers' staging area; the
// stage goes back once the store has read it (release_held_stage), by the
// next task of the CTA.
//
// Users: the bf16 weight-gradient tiles (weight_grad_tile.cuh) and the fused
// backward's dx_j tiles (roles/gemm_consumer.cuh), whose rows go by schedule
// row into the owner's dx rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "device/gemm/tile_config.cuh"
#include "device/gemm/tile_epilogue.cuh"
#include "device/pipeline/stage_ring.cuh"
#include "device/ptx/async_copy.cuh"
#include "device/ptx/bulk_copy.cuh"
#include "device/ptx/named_barrier.cuh"
#include "device/ptx/stmatrix.cuh"

namespace mok::device {

// The stage that a tile stored by TMA (store_tile_boxes_async) still reads,
// or -1. Every consumer warp keeps its own copy; they agree, since every
// consumer warpgroup runs every tile whose output is stored this way (an
// idle warpgroup included: it keeps the same stage and meets the store's
// barriers).
struct HeldStage {
  int stage = -1;
};

// Every consumer warp: once the bulk stores its lane 0 issued (if any) have
// read shared memory, hands the held stage back to the producer (the stage is
// refilled only once every consumer warp has). The staging area the stores
// also read is free for the CTA's other warps only after a barrier of every
// consumer warp that follows this (the next async store has one;
// gemm_consumer.cuh adds one before any other kind's epilogue).
template <int kStages>
__device__ __forceinline__ void release_held_stage(StageRing<kStages>& ring, HeldStage& held) {
  if (held.stage < 0) return;
  if (threadIdx.x % 32 == 0) {
    bulk_wait_read<0>();
    ring.consumer_release(held.stage);
  }
  __syncwarp();
  held.stage = -1;
}

// Whether this thread issues its warpgroup's box stores (and so owns their
// bulk group: only it can wait for them).
__device__ __forceinline__ bool issues_box_stores() { return threadIdx.x % 128 == 0; }

// The tile (128 x 256 bf16, 64 KB) as eight boxes of [64 rows][64 columns]
// (8 KB each: one warpgroup's rows, one 64-column block), 128-byte swizzled
// as the map says (out_map: bf16, box {64, 64}); box slot s = consumer * 4 +
// block lies in the held stage (48 KB: slots 0-5) or the staging area (16
// KB: slots 6-7), each warp its 16 rows of each of its warpgroup's boxes.
// Then one thread of each warpgroup (issues_box_stores) stores its four boxes
// at rows [row, row + 64), columns from col0 (those below n), and commits
// one bulk group, which release_held_stage waits for. Whole-warpgroup boxes
// rather than one per warp: the TMA unit's cost is mostly per box -- a tile
// in 32 boxes of 16 rows took ~1,290 cycles of the next K loop's tensor
// time, in these 8 ~560 (docs/perf-notes.md v10). A warpgroup whose rows
// are out (`rows_in` false, uniform over it) writes and stores nothing, but
// every consumer warpgroup must call it (two barriers, id `barrier_id`: both
// warpgroups' wgmma have read the held stage before either writes into it,
// and every warp's rows are written before a box is stored).
// Rounding: bf16_rn of each accumulator, as store_tile_rows. kAddToOut:
// each box is added to what out holds (tma_reduce_add_2d: old + the rounded
// box, rounded once more -- what adding a bf16 tensor to another gives)
// instead of stored over it.
template <class Cfg, bool kAddToOut = false>
__device__ __forceinline__ void store_tile_boxes_async(const float (&acc)[Cfg::kAccRegs], GemmSharedStorage<Cfg>& smem,
                                                       int consumer, const void* out_map, int col0, int row, int n,
                                                       bool rows_in, const HeldStage& held, int barrier_id) {
  constexpr int kBlocks = Cfg::kBlockN / 64;          // 64-column blocks of the tile
  constexpr int kBoxBytes = 64 * 128;                 // [64 rows][64 bf16 columns]
  constexpr int kWarpRowsBytes = 16 * 128;            // a warp's 16 rows of a box
  constexpr int kSlotsInStage = static_cast<int>(Cfg::kStageBytes) / kBoxBytes;
  constexpr int kSlots = Cfg::kConsumerWarpgroups * kBlocks;
  static_assert(Cfg::kBlockM == 128 && Cfg::kConsumerWarpgroups == 2, "two warpgroups of 64 output rows");
  static_assert(offsetof(typename GemmSharedStorage<Cfg>::Stage, b) == Cfg::kABytes,
                "a stage's A and B boxes are one run of bytes");
  static_assert((kSlots - kSlotsInStage) * kBoxBytes <= sizeof(GemmSharedStorage<Cfg>::staging),
                "the boxes past the stage fit in the staging area");
  static_assert(kBoxBytes % 1024 == 0 && Cfg::kStageBytes % 1024 == 0,
                "each box starts on a 1 KB boundary, where the 128-byte swizzle pattern starts");
  auto box_at = [&](int block) -> uint8_t* {
    const int slot = consumer * kBlocks + block;
    return slot < kSlotsInStage ? smem.stages[held.stage].a + slot * kBoxBytes
                                : &smem.staging[0][0] + (slot - kSlotsInStage) * kBoxBytes;
  };
  named_barrier_sync(barrier_id, 128 * Cfg::kConsumerWarpgroups);
  const int warp = static_cast<int>(threadIdx.x / 32) % 4;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (rows_in) {
    // stmatrix: this lane gives row st_row of chunk 2 * pair + st_chunk of the warp's 16 rows.
    const int st_row = ((lane >> 3) & 1) * 8 + (lane & 7);
    const int st_chunk = lane >> 4;
#pragma unroll
    for (int block = 0; block < kBlocks; ++block) {
      const uint32_t rows = shared_address(box_at(block)) + warp * kWarpRowsBytes;
#pragma unroll
      for (int pair = 0; pair < 4; ++pair) {
        const int j = block * 8 + 2 * pair;  // the 8-column chunk of the fragment
        const int chunk = 2 * pair + st_chunk;
        stmatrix_x4(rows + st_row * 128 + ((chunk ^ (st_row & 7)) * 16), pack_bf16x2(acc[4 * j], acc[4 * j + 1]),
                    pack_bf16x2(acc[4 * j + 2], acc[4 * j + 3]), pack_bf16x2(acc[4 * j + 4], acc[4 * j + 5]),
                    pack_bf16x2(acc[4 * j + 6], acc[4 * j + 7]));
      }
    }
    fence_proxy_async_shared();  // the generic writes above, before the bulk stores read them
  }
  // Every warp's rows of the boxes, before one thread stores them. (A CTA-wide
  // barrier rather than one per warpgroup: the warpgroups get here together,
  // and the kernels' barrier ids stay where they are.)
  named_barrier_sync(barrier_id, 128 * Cfg::kConsumerWarpgroups);
  if (rows_in && issues_box_stores()) {
#pragma unroll
    for (int block = 0; block < kBlocks; ++block) {
      if (col0 + block * 64 >= n) continue;
      if constexpr (kAddToOut) {
        tma_reduce_add_2d(out_map, box_at(block), col0 + block * 64, row);
      } else {
        tma_store_2d(out_map, box_at(block), col0 + block * 64, row);
      }
    }
    bulk_commit();
  }
}

}  // namespace mok::device
