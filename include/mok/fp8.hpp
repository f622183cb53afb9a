// Block-scaled FP8 as the FP8 passes will use it: e4m3 values with
// power-of-two (UE8M0) scales, one per 1 x 128 block of an activation row
// and one per 128 x 128 block of a weight (DeepSeek-V3's recipe, with MX's
// power-of-two scales so that rescaling is exact). Host code, bit-exact: the
// CPU reference and the weight quantizer use it, and the kernels' quantizers
// must reproduce it bit for bit.
//
// Rounding, written out:
//   scale  of a block with absolute maximum amax: 2^e for the smallest e with
//          amax <= 448 * 2^e (no element saturates), e clamped to [-127, 127];
//          e = 0 for an all-zero block.
//   value  e4m3(x / 2^e): round to nearest, ties to even, in the e4m3 grid
//          (subnormals included); |x / 2^e| above 448 cannot occur by the
//          scale's choice (a direct encode saturates to +-448).
//   e4m3   1 sign, 4 exponent (bias 7), 3 mantissa bits; max +-448; no
//          infinities; 0x7F / 0xFF are NaN (torch.float8_e4m3fn, Hopper's e4m3).
//   ue8m0  an exponent byte: 2^(byte - 127); 255 is NaN.
// NaN or infinite inputs are refused (mok::Error naming the block): a weight
// quantizer runs once, offline, and a non-finite weight is a bug upstream.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mok::fp8 {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr int kBlock = 128;  // weight blocks are kBlock x kBlock, activation blocks 1 x kBlock

uint8_t encode_e4m3(float value);
float decode_e4m3(uint8_t bits);

// The block scale's exponent for a block whose absolute maximum is `amax`.
int32_t scale_exponent(float amax);
inline uint8_t encode_ue8m0(int32_t exponent) { return static_cast<uint8_t>(exponent + 127); }
float decode_ue8m0(uint8_t bits);

// One weight tensor [groups, rows, cols] (rows and cols multiples of 128),
// quantized in 128 x 128 blocks, plus its transposed copy [groups, cols,
// rows] -- what a backward's K-major FP8 operand needs. 128 x 128 blocks
// transpose exactly: the copy is the quantization of the transposed weight.
struct QuantizedWeight {
  int64_t groups = 0, rows = 0, cols = 0;
  std::vector<uint8_t> values;    // e4m3 [groups, rows, cols]
  std::vector<uint8_t> scales;    // ue8m0 [groups, rows / 128, cols / 128]
  std::vector<uint8_t> values_t;  // e4m3 [groups, cols, rows]
  std::vector<uint8_t> scales_t;  // ue8m0 [groups, cols / 128, rows / 128]
};
QuantizedWeight quantize_weight(std::span<const float> weight, int64_t groups, int64_t rows, int64_t cols);

// Activation rows [rows, cols] (cols a multiple of 128) in 1 x 128 blocks:
// values e4m3 [rows, cols], scales ue8m0 [rows, cols / 128].
void quantize_rows(std::span<const float> x, int64_t rows, int64_t cols, std::span<uint8_t> values,
                   std::span<uint8_t> scales);

}  // namespace mok::fp8
