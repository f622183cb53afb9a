// A stage's A scales in shared memory (the fused FP8 forward): the ue8m0
// bytes of the tile's rows at the stage's 128-deep k-block, brought by the
// producer with the stage's A and B tiles and counted in the same full
// barrier, so that a consumer thread reads its two rows' scales from shared
// memory once it has waited for the stage -- instead of from L2 in the K
// loop, where the load's latency sat between the stage barrier and the
// stage's first wgmma (Nsight Compute on an H200: 11% of the loop's stall
// samples on that one dependency).
//
// The rings keep their scales k-block-major (protocol/ring_scales.hpp), so
// the BM bytes of a tile's rows at one k-block are contiguous: one bulk copy
// a stage. Only where the bytes come from changes: the same scale multiplies
// the same partial sum as before, so the bits are the same.
#pragma once

#include <cstdint>

#include "device/ptx/bulk_copy.cuh"
#include "device/ptx/vector_io.cuh"

namespace mok::device {

// One slot of kRows scale bytes per stage of the ring. 128-byte aligned: a
// bulk copy's destination needs 16.
template <int kStages, int kRows>
struct StageScaleSlots {
  static_assert(kRows % 16 == 0, "a bulk copy moves a multiple of 16 bytes");
  alignas(128) uint8_t rows[kStages][kRows];
};

// The producer's copy of stage `stage`'s A scales (load_tile calls it with
// each stage's k-block and full barrier): the ring scale array's bytes
// [kb * pitch + row0, + kRows). A tile of the fused forward is a whole
// 128-row tile of the ring (protocol::ring_row_of_tile: rows [row0, row0 +
// 128), inside the ring because its rows are whole tiles,
// forward_options.cpp's require_ring), the very rows the A tile's TMA box
// reads, so the copy never runs past the array nor wraps, and its source is
// 16-byte aligned (row0 a multiple of 128, the pitch of 16). No row of it is
// past the ring (the grouped GEMM's register path clamps such rows to row
// m_total - 1; were one ever zero-filled, as a tensor-map copy would, its
// byte would decode to ue8m0_value(0) = 2^-127, finite, and its zero
// operand row would still give zeros). A tile's padding rows get their ring
// rows' bytes, whatever they hold, as the register path read them (their
// products are never stored). `tile_scales` = the array + row0 (k-block 0);
// 32-bit offsets: pitch x blocks < 2^31 (forward_options.cpp's
// require_fp8_ring).
template <int kStages, int kRows>
struct RingScaleStageCopy {
  static constexpr uint32_t kBytes = kRows;  // the stage's bytes besides A and B
  StageScaleSlots<kStages, kRows>* slots;
  const uint8_t* tile_scales;
  int32_t pitch;
  __device__ __forceinline__ void operator()(int kb, int stage, uint64_t* full) const {
    bulk_load(slots->rows[stage], tile_scales + kb * pitch, kBytes, full);
  }
};

// A tile's B scales in shared memory (the fused FP8 forward): the pair of
// ue8m0 bytes of its two 128-row weight blocks ("halves": a gate/up tile's
// gate and up blocks, a plain tile's two neighbouring ones) for each 128-deep
// k-block, [kb][half]. The GEMM CTA's row-resolver warp writes a task's table
// when the producer posts the task, a ring's depth of stages before the
// consumers reach it (roles/fp8_task_scales.cuh); the consumers read one pair
// a stage with a 16-bit shared load. They read them from L2 before, a stage
// ahead through __ldg: ptxas sank that load to the stage boundary and,
// ordered behind the wait for the stage's last quarter, moved the wait above
// the promotion of the quarter before, which then ran with no tensor work of
// its warpgroup in flight (docs/perf-notes.md v25). The same bytes multiply
// the same partial sums: the same bits.
inline constexpr int kMaxFp8KBlocks = 256;  // K <= 32768 (forward_options.cpp refuses more)

struct TileBScalePairs {
  alignas(16) uint8_t pairs[kMaxFp8KBlocks][2];
};

// One warp (every lane): the tile's two B-scale rows, `k_blocks` bytes each
// at offsets `half0` and `half1` of `b` (weights' scales, written before the
// launch: read through the non-coherent cache), into `table`. The caller
// orders these stores before the table's readers (__syncwarp, then an
// mbarrier arrival that they wait on).
__device__ __forceinline__ void stage_tile_b_scales(TileBScalePairs& table, const uint8_t* b, int32_t half0,
                                                    int32_t half1, int k_blocks, int lane) {
  for (int i = lane; i < 2 * k_blocks; i += 32) {
    const int kb = i >> 1, half = i & 1;
    table.pairs[kb][half] = __ldg(b + (half ? half1 : half0) + kb);
  }
}

// k-block kb's pair from the table at shared address `table`: half 0 in bits
// 0-7, half 1 in bits 8-15.
__device__ __forceinline__ uint32_t tile_b_scale_pair(uint32_t table, int kb) {
  return ld_shared_u16(table + static_cast<uint32_t>(2 * kb));
}

// A consumer thread's A scale byte at row `row` of the tile, in stage
// `stage`: only after that stage's full barrier wait (ld_shared_u8 keeps
// program order), and before the stage is released.
template <int kStages, int kRows>
__device__ __forceinline__ uint32_t stage_scale_byte(uint32_t slots_address, int stage, int row) {
  return ld_shared_u8(slots_address + static_cast<uint32_t>(stage * kRows + row));
}

}  // namespace mok::device
