// The FP8 scale rule on a float's bits, for the kernels that quantize (the
// dispatch's rows, the gate/up epilogue's h, the row quantizer): the smallest
// e with amax <= 448 * 2^e, clamped to [-127, 127]; 0 for a zero block, a NaN
// or a negative input; 127 for +infinity. mok::fp8::scale_exponent (the host
// quantizer and the CPU reference) computes the same through frexp; the two
// agree on every one of the 2^32 inputs (checked once exhaustively; the CPU
// test walks every exponent's boundaries and a stride of all patterns).
//
// Why on the bits: the frexp form branches (zero, infinity, and frexpf's own
// subnormal path), and a branch inside a quantizing warp's step stops the
// compiler from interleaving the steps' shuffle reductions, which left the
// FP8 dispatch latency-bound (docs/perf-notes.md q9). Here every case is a
// select.
//
// For a normal amax = m * 2^E (m in [1, 2)): 448 = 1.75 * 2^8, so e = E - 8
// where m <= 1.75 (mantissa field <= 0x600000), else E - 7. Subnormals give
// e < -127, clamped: the rule's -127, as frexp's.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace mok::fp8 {

MOK_HD int32_t scale_exponent_of_bits(uint32_t bits) {
  const int32_t exponent_field = static_cast<int32_t>((bits >> 23) & 0xFFu);
  const uint32_t mantissa = bits & 0x7FFFFFu;
  int32_t e = exponent_field - 135 + (mantissa > 0x600000u ? 1 : 0);
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  e = (bits & 0x7FFFFFFFu) == 0 ? 0 : e;                       // +-0: an all-zero block
  e = exponent_field == 255 ? (mantissa == 0 ? 127 : 0) : e;  // infinity, NaN
  return (bits >> 31) != 0 ? 0 : e;                           // not an amax (-inf, -NaN too)
}

}  // namespace mok::fp8
