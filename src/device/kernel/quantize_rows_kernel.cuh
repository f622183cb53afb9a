// The row quantizer (include/mok/quantize_rows.hpp): one warp per 1 x 128
// block, each lane four consecutive values (8 bytes in, 4 bytes out, so a
// warp reads 256 and writes 128 contiguous bytes). The block's amax is a
// warp max (order-free), its scale and each value follow quant/e4m3.cuh.
#pragma once

#include <cstdint>

#include "device/quant/e4m3.cuh"

namespace mok::device {

__global__ void quantize_rows_kernel(const uint16_t* x, uint8_t* values, uint8_t* scales, int64_t blocks) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; b < blocks; b += warps) {
    // Block b of the row-major [rows, cols] is elements [128 b, 128 b + 128).
    uint8_t scale;
    const uint32_t bytes = quantize_block_warp(*reinterpret_cast<const uint2*>(x + b * 128 + lane * 4), scale);
    *reinterpret_cast<uint32_t*>(values + b * 128 + lane * 4) = bytes;
    if (lane == 0) scales[b] = scale;
  }
}

}  // namespace mok::device
