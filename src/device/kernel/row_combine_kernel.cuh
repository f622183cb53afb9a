// The row combine (include/mok/row_combine.hpp): one thread per 8 columns of
// one token, 16-byte loads of each contributing row, fp32 sums in slot order.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "device/kernel/bf16x8.cuh"

namespace mok::device {

__global__ void row_combine_kernel(const uint16_t* rows, const int32_t* row_index, const uint16_t* base,
                                   uint16_t* out, int64_t tokens, int k, int64_t width) {
  const int64_t chunks = width / 8;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= tokens * chunks) return;
  const int64_t token = item / chunks;
  const int64_t col = (item - token * chunks) * 8;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (base != nullptr) add_bf16x8(acc, *reinterpret_cast<const uint4*>(base + token * width + col));
  for (int j = 0; j < k; ++j) {
    const int32_t row = row_index[token * k + j];
    if (row >= 0) add_bf16x8(acc, *reinterpret_cast<const uint4*>(rows + static_cast<int64_t>(row) * width + col));
  }
  uint4 packed;
  __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int i = 0; i < 4; ++i) p[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  *reinterpret_cast<uint4*>(out + token * width + col) = packed;
}

}  // namespace mok::device
