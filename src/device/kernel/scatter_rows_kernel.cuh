// The row scatter (include/mok/scatter_rows.hpp). Blocks [0, tokens) copy
// one token's source rows to the rows its entries claim, 16 bytes a thread a
// source per step, each load stored k times; the blocks after them zero the
// unclaimed rows, kScatterZeroRows rows a block.
#pragma once

#include <cstdint>

#include "mok/scatter_rows.hpp"

namespace mok::device {

inline constexpr int kScatterThreads = 128;
inline constexpr int kScatterZeroRows = 32;
inline constexpr int kScatterMaxK = 64;  // entries of one token (validated)

struct ScatterRowsParams {
  const uint4* sources[kMaxScatterSources];
  uint4* outs[kMaxScatterSources];
  int num_sources;
  const int64_t* row_of_entry;
  const int64_t* entry_of_row;
  int64_t tokens;
  int k;
  int64_t num_rows;
  int64_t chunks;  // 16-byte chunks of a row
};

// Whether row `row` holds entry `entry`, both indices agreeing (any value:
// out of range claims nothing).
__device__ __forceinline__ bool row_claimed(const ScatterRowsParams& p, int64_t entry, int64_t row) {
  return entry >= 0 && entry < p.tokens * p.k && row >= 0 && row < p.num_rows && p.row_of_entry[entry] == row &&
         p.entry_of_row[row] == entry;
}

__global__ void __launch_bounds__(kScatterThreads) scatter_rows_kernel(const __grid_constant__ ScatterRowsParams p) {
  __shared__ int64_t rows[kScatterMaxK > kScatterZeroRows ? kScatterMaxK : kScatterZeroRows];
  const int64_t block = blockIdx.x;
  if (block < p.tokens) {
    const int64_t token = block;
    for (int j = threadIdx.x; j < p.k; j += blockDim.x) {
      const int64_t entry = token * p.k + j;
      const int64_t row = p.row_of_entry[entry];
      rows[j] = row_claimed(p, entry, row) ? row : -1;
    }
    __syncthreads();
    for (int s = 0; s < p.num_sources; ++s) {
      const uint4* src = p.sources[s] + token * p.chunks;
      uint4* out = p.outs[s];
      for (int64_t c = threadIdx.x; c < p.chunks; c += blockDim.x) {
        const uint4 v = src[c];
        for (int j = 0; j < p.k; ++j) {
          if (rows[j] >= 0) out[rows[j] * p.chunks + c] = v;
        }
      }
    }
    return;
  }
  // Zero the unclaimed rows of this block's range.
  const int64_t first = (block - p.tokens) * kScatterZeroRows;
  const int count = static_cast<int>(p.num_rows - first < kScatterZeroRows ? p.num_rows - first : kScatterZeroRows);
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    const int64_t row = first + i;
    rows[i] = row_claimed(p, p.entry_of_row[row], row) ? -1 : row;
  }
  __syncthreads();
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  for (int i = 0; i < count; ++i) {
    if (rows[i] < 0) continue;
    for (int s = 0; s < p.num_sources; ++s) {
      uint4* out = p.outs[s] + rows[i] * p.chunks;
      for (int64_t c = threadIdx.x; c < p.chunks; c += blockDim.x) out[c] = zero;
    }
  }
}

}  // namespace mok::device
