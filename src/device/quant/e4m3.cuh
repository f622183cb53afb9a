// Block-scaled FP8 on the device: the scale rule and the e4m3 rounding of
// include/mok/fp8.hpp, bit for bit, for the kernels that quantize (the row
// quantizer, the FP8 gate/up epilogue) and the scale decode the FP8
// mainloop promotes with.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "quant/scale_exponent_rule.hpp"

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
// to +-448 and the block's finite values flush toward zero. Computed on the
// bits, with no branch (quant/scale_exponent_rule.hpp says why).
__device__ __forceinline__ int32_t fp8_scale_exponent(float amax) {
  return fp8::scale_exponent_of_bits(__float_as_uint(amax));
}

// Two values to e4m3, round to nearest even, saturating: lo in the low byte.
__device__ __forceinline__ uint16_t pack_e4m3x2(float lo, float hi) {
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

// One 1 x 128 block of bf16 values quantized by a warp: `raw` is this lane's
// four consecutive values (lane l: values 4l .. 4l + 3). Returns this lane's
// four e4m3 bytes (lowest value in the lowest byte) and, in `scale`, the
// block's ue8m0 byte (every lane gets it). The amax is a warp max
// (order-free): the bytes depend only on the block.
__device__ __forceinline__ uint32_t quantize_block_warp(uint2 raw, uint8_t& scale) {
  const float v[4] = {__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xFFFF0000u),
                      __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xFFFF0000u)};
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
  for (int d = 16; d >= 1; d /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
  const int32_t e = fp8_scale_exponent(amax);
  const float inv = ue8m0_value(static_cast<uint32_t>(127 - e));  // 2^-e, exact
  const uint32_t lo = pack_e4m3x2(__fmul_rn(v[0], inv), __fmul_rn(v[1], inv));
  const uint32_t hi = pack_e4m3x2(__fmul_rn(v[2], inv), __fmul_rn(v[3], inv));
  scale = static_cast<uint8_t>(127 + e);
  return lo | (hi << 16);
}

// Two 1 x 128 blocks of bf16 values quantized by a warp, one per half-warp,
// in three phases so that a caller quantizing several steps at once can
// interleave their shuffle reductions (each a chain of four dependent
// shuffles; the dispatch does, dispatch_role.cuh). `raw` is this lane's
// eight consecutive values (lane l: values 8 (l % 16) .. of block l / 16).
// half_block_lane_amax: this lane's absolute maximum; half_block_amax_reduce:
// the half-warp's, for every step at once (a max: order-free);
// quantize_half_block_with_amax: this lane's eight e4m3 bytes (lowest value
// in the lowest byte) and, in `scale`, its block's ue8m0 byte. The same
// rule, value for value, as quantize_block_warp.
__device__ __forceinline__ float half_block_lane_amax(uint4 raw) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    amax = fmaxf(amax, fabsf(__uint_as_float(w[i] << 16)));
    amax = fmaxf(amax, fabsf(__uint_as_float(w[i] & 0xFFFF0000u)));
  }
  return amax;
}

// The block maximum over its kLanes consecutive lanes (a max: order-free),
// for every step at once: log2(kLanes) rounds of shuffles.
template <int kLanes, int kCount>
__device__ __forceinline__ void block_amax_reduce(float (&amax)[kCount]) {
#pragma unroll
  for (int d = kLanes / 2; d >= 1; d /= 2) {
#pragma unroll
    for (int i = 0; i < kCount; ++i) amax[i] = fmaxf(amax[i], __shfl_xor_sync(0xffffffffu, amax[i], d));
  }
}
template <int kCount>
__device__ __forceinline__ void half_block_amax_reduce(float (&amax)[kCount]) {
  block_amax_reduce<16>(amax);
}

// Eight consecutive bf16 values times 2^-e (`inv`, exact) to e4m3, lowest
// value in the lowest byte.
__device__ __forceinline__ uint2 quantize_eight_with_inverse(uint4 raw, float inv) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t q[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    q[i] = pack_e4m3x2(__fmul_rn(__uint_as_float(w[i] << 16), inv),
                       __fmul_rn(__uint_as_float(w[i] & 0xFFFF0000u), inv));
  }
  return make_uint2(q[0] | (q[1] << 16), q[2] | (q[3] << 16));
}

__device__ __forceinline__ uint2 quantize_half_block_with_amax(uint4 raw, float amax, uint8_t& scale) {
  const int32_t e = fp8_scale_exponent(amax);
  scale = static_cast<uint8_t>(127 + e);
  return quantize_eight_with_inverse(raw, ue8m0_value(static_cast<uint32_t>(127 - e)));  // 2^-e, exact
}

// Four 1 x 128 blocks of bf16 values quantized by a warp, one per quarter-warp
// (eight lanes), in the same three phases: each lane holds sixteen
// consecutive values (two 16-byte halves: lane l values 16 (l % 8) .. of
// block l / 8), so a value costs half the shuffles and scale arithmetic of
// the half-warp form (three shuffle rounds for sixteen values, not four for
// eight). The same rule, value for value: the same bytes.
__device__ __forceinline__ float quarter_block_lane_amax(uint4 lo, uint4 hi) {
  return fmaxf(half_block_lane_amax(lo), half_block_lane_amax(hi));
}

template <int kCount>
__device__ __forceinline__ void quarter_block_amax_reduce(float (&amax)[kCount]) {
  block_amax_reduce<8>(amax);
}

// This lane's sixteen e4m3 bytes (lowest value in the lowest byte) and, in
// `scale`, its block's ue8m0 byte.
__device__ __forceinline__ uint4 quantize_quarter_block_with_amax(uint4 lo, uint4 hi, float amax, uint8_t& scale) {
  const int32_t e = fp8_scale_exponent(amax);
  const float inv = ue8m0_value(static_cast<uint32_t>(127 - e));  // 2^-e, exact
  const uint2 a = quantize_eight_with_inverse(lo, inv), b = quantize_eight_with_inverse(hi, inv);
  scale = static_cast<uint8_t>(127 + e);
  return make_uint4(a.x, a.y, b.x, b.y);
}

}  // namespace mok::device
