// A tile epilogue whose rows go wherever the caller says: row i of the tile
// is stored at row_ptr(i) + column (nullptr: not stored). The routed down
// GEMM uses it to put each (token, slot) result straight into its home rank's
// combine row; plain contiguous outputs are the special case
// row_ptr(i) = out + (row0 + i) * ld.
//
// Same arithmetic and staging as store_tile (tile_epilogue.cuh): accumulators
// -> bf16 pairs (epilogue_pair) -> swizzled stmatrix staging -> 16-byte stores.
#pragma once

#include <cstdint>

#include "device/gemm/tile_config.cuh"
#include "device/gemm/tile_epilogue.cuh"
#include "device/ptx/stmatrix.cuh"

namespace mok::device {

// Consumer warpgroup `consumer` stores its 64 rows; columns [col0, col0 +
// kOutCols) of the tile, clipped to n_cols (a multiple of 64).
template <class Cfg, class RowPtr>
__device__ __forceinline__ void store_tile_rows(const float (&acc)[Cfg::kAccRegs],
                                                GemmSharedStorage<Cfg>& smem, int consumer,
                                                int col0, int n_cols, const RowPtr& row_ptr) {
  const int warp = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;
  uint8_t* staging = smem.staging[consumer * 4 + warp];
  const int st_row = ((lane >> 3) & 1) * 8 + (lane & 7);
  const int st_chunk = lane >> 4;
  const int first_row = consumer * 64 + warp * 16;  // within the tile

  // The four rows this lane stores, resolved once for every slab.
  uint16_t* dst[4];
#pragma unroll
  for (int it = 0; it < 4; ++it) dst[it] = row_ptr(first_row + it * 4 + (lane >> 3));

#pragma unroll
  for (int slab = 0; slab < Cfg::kOutCols / 64; ++slab) {
    const int c0 = col0 + slab * 64;
    if (c0 >= n_cols) break;  // warp-uniform
#pragma unroll
    for (int pair = 0; pair < 4; ++pair) {
      const int j = slab * 8 + 2 * pair;
      const int chunk = 2 * pair + st_chunk;
      stmatrix_x4(staging + st_row * 128 + ((chunk ^ (st_row & 7)) * 16),
                  epilogue_pair<Cfg>(acc, j, 0), epilogue_pair<Cfg>(acc, j, 1),
                  epilogue_pair<Cfg>(acc, j + 1, 0), epilogue_pair<Cfg>(acc, j + 1, 1));
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 4; ++it) {
      const int r = it * 4 + (lane >> 3);
      const int c = lane & 7;
      const uint4 v = *reinterpret_cast<const uint4*>(staging + r * 128 + ((c ^ (r & 7)) * 16));
      if (dst[it] != nullptr) *reinterpret_cast<uint4*>(dst[it] + c0 + c * 8) = v;
    }
    __syncwarp();
  }
}

}  // namespace mok::device
