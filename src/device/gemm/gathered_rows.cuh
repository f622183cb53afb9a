// Operand rows gathered on load: a stage's rows of an activation operand
// read straight from their source tensor through an index (row r of the
// operand is row index[r] of the source), instead of from a gathered copy
// that a separate kernel wrote first. The staged backward's operands are rows
// of x and dout in schedule order: gathering them as they are loaded saves
// each copy's write and read (two [rows, H] bf16 tensors a layer, ~0.47 GB
// each on the DeepSeek-V3 slice) and the kernels that made them.
//
// Hopper's TMA has no row gather, but a box may be one row: the source's map
// has boxes of {64 elements, 1 row} (128 bytes, 128-byte swizzle), and the
// producer warp's lanes issue one TMA per (stage row, 64-column box). The
// swizzle follows the destination's shared-memory address, so a one-row box
// written at row r of a 1024-byte-aligned box lands exactly where the
// operand's whole box would have put it; every copy completes on the stage's
// full barrier like the others, so the consumers see no difference.
// (cp.async, tried first -- branch history -- ran the kernels 1.7-2.5x
// slower: it needs a fence and an arrival per thread and stage, and its
// 16-byte requests used L2 sectors by halves.)
//
// Rows the operand does not need (past a group's end, where the whole box
// would have brought the next group's rows) are loaded from source row 0, so
// that every stage still receives its full byte count; the consumers clear
// them (weight gradients) or nobody stores what they feed (the grouped
// GEMM's rows past its tile's group).
#pragma once

#include <cstdint>

#include "device/ptx/async_copy.cuh"

namespace mok::device {

// An operand read through an index; index null = not gathered (its map then
// covers the operand itself, with whole boxes).
struct GatheredRows {
  const int32_t* index = nullptr;  // [operand rows]: each in [0, source_rows)
  int32_t source_rows = 0;
};

// The source row of operand row `row`, or 0 where the row is not needed
// (`needed` false). Unchecked: loaded a stage ahead, its latency overlaps the
// wait for the stage; checked() checks it where it is used.
__device__ __forceinline__ int32_t source_of(const GatheredRows& g, int row, bool needed) {
  return needed ? __ldg(g.index + row) : 0;
}

// A source row out of range is a caller's bug that TMA would turn into rows
// of zeros without a word: the kernel traps instead (the launch fails).
__device__ __forceinline__ int32_t checked(const GatheredRows& g, int32_t source) {
  if (static_cast<uint32_t>(source) >= static_cast<uint32_t>(g.source_rows)) __trap();
  return source;
}

// Lane `lane` of the producer warp: its rows of a stage are lane + 32 i. For
// each, kBoxes one-row boxes at columns c0, c0 + 64, ...: box j of stage row
// r goes to boxes + j * box_bytes + r * 128, where a whole [rows][64] box
// keeps row r. `sources[i]` is row lane + 32 i's source (source_of). Columns
// past the source's width are zeros, as with whole boxes.
template <int kRowsPerLane, int kBoxes>
__device__ __forceinline__ void load_gathered_rows(uint8_t* boxes, int box_bytes, const void* map, uint64_t* full,
                                                   const GatheredRows& g, const int32_t (&sources)[kRowsPerLane],
                                                   int c0, int lane) {
#pragma unroll
  for (int i = 0; i < kRowsPerLane; ++i) {
    const int32_t source = checked(g, sources[i]);
#pragma unroll
    for (int j = 0; j < kBoxes; ++j) {
      tma_load_2d(boxes + j * box_bytes + (lane + 32 * i) * 128, map, full, c0 + 64 * j, source);
    }
  }
}

}  // namespace mok::device
