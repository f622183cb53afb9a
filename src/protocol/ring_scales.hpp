// Where the FP8 forward's rings keep their rows' ue8m0 scales (one per 128
// columns of a row): k-block-major, [row / 128 blocks][pitch], so that the
// scales of a tile's rows at one k-block are contiguous bytes, which the
// producer copies with the stage's A and B tiles into shared memory (one bulk
// copy per stage, device/gemm/fp8_stage_scales.cuh) instead of every
// consumer thread loading its rows' scales from L2 in the K loop. The host
// carves the arrays (world/workspace_layout.cpp); the dispatch (x) and the
// gate/up epilogue (h) write them; one rule for all.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace mok::protocol {

// Bytes from one k-block's scales to the next: the ring's rows rounded up to
// 16, what a bulk copy's source alignment needs. (The ring's rows are whole
// 128-row tiles, forward_options.cpp's require_ring, so today it is the row
// count itself.)
MOK_HD constexpr int64_t ring_scale_pitch(int64_t ring_rows) { return (ring_rows + 15) / 16 * 16; }

// The byte of ring row `row`'s scale for columns [128 block, 128 block + 128).
MOK_HD constexpr int64_t ring_scale_index(int64_t row, int64_t block, int64_t pitch) { return block * pitch + row; }

// Bytes of one ring's scale array: `columns` / 128 blocks of `pitch`.
MOK_HD constexpr int64_t ring_scale_bytes(int64_t ring_rows, int64_t columns) {
  return columns / 128 * ring_scale_pitch(ring_rows);
}

}  // namespace mok::protocol
