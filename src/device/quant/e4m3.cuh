// Block-scaled FP8 on the device: the scale rule and the e4m3 rounding of
// include/mok/fp8.hpp, bit for bit, for the kernels that quantize (the row
// quantizer, the FP8 gate/up epilogue) and the scale decode the FP8
// mainloop promotes with.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace mok::device {

// 2^(e - 127) (byte 0 is 2^-127, a subnormal; the quantizer never writes 255).
__device__ __forceinline__ float ue8m0_value(uint32_t e) {
  return e == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(e << 23);
}

// The scale exponent of a block with absolute maximum amax, as
// mok::fp8::scale_exponent computes it on the host: the smallest e with
// amax <= 448 * 2^e, clamped to [-127, 127]; 0 for an all-zero block (and
// for NaN: the values then carry it). The host refuses non-finite blocks;
// here an infinite amax takes the largest scale, so the infinity saturates
// to +-448 and the block's finite values flush toward zero (frexpf of an
// infinity returns no usable exponent).
__device__ __forceinline__ int32_t fp8_scale_exponent(float amax) {
  if (!(amax > 0.0f)) return 0;
  if (isinf(amax)) return 127;
  int k = 0;
  const float f = frexpf(amax, &k);  // amax = f * 2^k, f in [0.5, 1); 448 = 0.875 * 2^9
  const int32_t e = f <= 0.875f ? k - 9 : k - 8;
  return min(max(e, -127), 127);
}

// Two values to e4m3, round to nearest even, saturating: lo in the low byte.
__device__ __forceinline__ uint16_t pack_e4m3x2(float lo, float hi) {
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

}  // namespace mok::device
