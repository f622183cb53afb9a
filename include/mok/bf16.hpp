// Host-side bf16 conversions, bit-exact with the device's round-to-nearest-even
// (__float2bfloat16_rn), so that host code can produce the very values a
// kernel stores.
#pragma once

#include <cstdint>
#include <cstring>

namespace mok {

inline float bf16_bits_to_float(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

inline uint16_t float_to_bf16_bits(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  if ((word & 0x7f800000u) == 0x7f800000u && (word & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((word >> 16) | 0x0040u);  // keep NaN a (quiet) NaN
  }
  const uint32_t rounding = 0x7fffu + ((word >> 16) & 1u);  // ties to even
  return static_cast<uint16_t>((word + rounding) >> 16);
}

// The float nearest to `value` that bf16 can hold.
inline float round_to_bf16(float value) { return bf16_bits_to_float(float_to_bf16_bits(value)); }

}  // namespace mok
