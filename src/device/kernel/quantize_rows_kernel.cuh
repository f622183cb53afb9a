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
    const uint2 raw = *reinterpret_cast<const uint2*>(x + b * 128 + lane * 4);
    const float v[4] = {__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xFFFF0000u),
                        __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xFFFF0000u)};
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
    for (int d = 16; d >= 1; d /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
    const int32_t e = fp8_scale_exponent(amax);
    const float inv = ue8m0_value(static_cast<uint32_t>(127 - e));  // 2^-e, exact
    const uint32_t lo = pack_e4m3x2(__fmul_rn(v[0], inv), __fmul_rn(v[1], inv));
    const uint32_t hi = pack_e4m3x2(__fmul_rn(v[2], inv), __fmul_rn(v[3], inv));
    *reinterpret_cast<uint32_t*>(values + b * 128 + lane * 4) = lo | (hi << 16);
    if (lane == 0) scales[b] = static_cast<uint8_t>(127 + e);
  }
}

}  // namespace mok::device
