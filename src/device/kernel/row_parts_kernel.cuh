// Sums each real row's per-n-tile parts in n-tile order: the second step of
// the SwiGLU backward's router-weight gradient (the first is the epilogue's
// per-tile part, gemm/tile_epilogue_swiglu_backward.cuh). One CTA per group;
// rows outside every group are not written.
#pragma once

#include <cstdint>

namespace mok::device {

__global__ void sum_row_parts_kernel(const float* parts, int cols, const int32_t* group_offset,
                                     const int32_t* group_rows, float* out) {
  const int group = static_cast<int>(blockIdx.x);
  const int first = group_offset[group];
  const int rows = max(group_rows[group], 0);
  for (int i = static_cast<int>(threadIdx.x); i < rows; i += static_cast<int>(blockDim.x)) {
    const float* row = parts + static_cast<int64_t>(first + i) * cols;
    float sum = row[0];
    for (int c = 1; c < cols; ++c) sum = __fadd_rn(sum, row[c]);
    out[first + i] = sum;
  }
}

}  // namespace mok::device
