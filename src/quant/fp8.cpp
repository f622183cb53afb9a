#include "mok/fp8.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "mok/error.hpp"

namespace mok::fp8 {
namespace {

std::string block_name(int64_t g, int64_t r, int64_t c) {
  return "[" + std::to_string(g) + ", " + std::to_string(r) + ", " + std::to_string(c) + "]";
}

void require_dims(int64_t groups, int64_t rows, int64_t cols, size_t size, bool square_blocks) {
  if (groups < 1 || rows < 1 || cols < 1 || cols % kBlock != 0 || (square_blocks && rows % kBlock != 0)) {
    throw Error("fp8 quantizer: dims [" + std::to_string(groups) + ", " + std::to_string(rows) + ", " +
                std::to_string(cols) + "]: need positive dims, cols" + (square_blocks ? " and rows" : "") +
                " a multiple of 128");
  }
  if (size != static_cast<size_t>(groups * rows * cols)) {
    throw Error("fp8 quantizer: " + std::to_string(size) + " values for dims of " +
                std::to_string(groups * rows * cols));
  }
}

}  // namespace

uint8_t encode_e4m3(float value) {
  if (std::isnan(value)) return 0x7F;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const float a = std::fabs(value);
  if (a >= kE4M3Max) return sign | 0x7E;  // satfinite: +-448
  // Subnormals: multiples of 2^-9 below 2^-6 (m = 8 rounds up into the first
  // normal, whose code is 8 too).
  if (a < 0x1p-6f) {
    const float m = std::nearbyint(a * 0x1p9f);  // ties to even (the default rounding mode)
    return sign | static_cast<uint8_t>(m);
  }
  int exponent = 0;
  std::frexp(a, &exponent);  // a = f * 2^exponent, f in [0.5, 1)
  int e = exponent - 1;      // a in [2^e, 2^(e+1))
  float m = std::nearbyint((std::ldexp(a, -e) - 1.0f) * 8.0f);  // exact before the rounding
  if (m == 8.0f) {
    m = 0.0f;
    ++e;
  }
  if (e > 8 || (e == 8 && m > 6.0f)) return sign | 0x7E;  // rounded past 448
  return sign | static_cast<uint8_t>(((e + 7) << 3) | static_cast<int>(m));
}

float decode_e4m3(uint8_t bits) {
  const int e = (bits >> 3) & 0xF, m = bits & 0x7;
  const float sign = (bits & 0x80) ? -1.0f : 1.0f;
  if (e == 0xF && m == 0x7) return std::nanf("");
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
}

int32_t scale_exponent(float amax) {
  if (!(amax > 0.0f)) return 0;  // an all-zero block
  int k = 0;
  const float f = std::frexp(amax, &k);  // amax = f * 2^k; 448 = 0.875 * 2^9
  const int32_t e = f <= 0.875f ? k - 9 : k - 8;
  return std::clamp<int32_t>(e, -127, 127);
}

float decode_ue8m0(uint8_t bits) {
  if (bits == 0xFF) return std::nanf("");
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

QuantizedWeight quantize_weight(std::span<const float> weight, int64_t groups, int64_t rows, int64_t cols) {
  require_dims(groups, rows, cols, weight.size(), true);
  QuantizedWeight q;
  q.groups = groups;
  q.rows = rows;
  q.cols = cols;
  const int64_t rb = rows / kBlock, cb = cols / kBlock;
  q.values.resize(weight.size());
  q.values_t.resize(weight.size());
  q.scales.resize(static_cast<size_t>(groups * rb * cb));
  q.scales_t.resize(q.scales.size());
  for (int64_t g = 0; g < groups; ++g) {
    const float* w = weight.data() + g * rows * cols;
    for (int64_t br = 0; br < rb; ++br) {
      for (int64_t bc = 0; bc < cb; ++bc) {
        float amax = 0.0f;
        for (int64_t r = br * kBlock; r < (br + 1) * kBlock; ++r) {
          for (int64_t c = bc * kBlock; c < (bc + 1) * kBlock; ++c) {
            const float v = w[r * cols + c];
            if (!std::isfinite(v)) {
              throw Error("fp8 quantizer: weight" + block_name(g, r, c) + " is not finite");
            }
            amax = std::max(amax, std::fabs(v));
          }
        }
        const int32_t e = scale_exponent(amax);
        q.scales[static_cast<size_t>((g * rb + br) * cb + bc)] = encode_ue8m0(e);
        q.scales_t[static_cast<size_t>((g * cb + bc) * rb + br)] = encode_ue8m0(e);
        for (int64_t r = br * kBlock; r < (br + 1) * kBlock; ++r) {
          for (int64_t c = bc * kBlock; c < (bc + 1) * kBlock; ++c) {
            const uint8_t v = encode_e4m3(std::ldexp(w[r * cols + c], -e));  // a power of two: exact
            q.values[static_cast<size_t>((g * rows + r) * cols + c)] = v;
            q.values_t[static_cast<size_t>((g * cols + c) * rows + r)] = v;
          }
        }
      }
    }
  }
  return q;
}

void quantize_rows(std::span<const float> x, int64_t rows, int64_t cols, std::span<uint8_t> values,
                   std::span<uint8_t> scales) {
  require_dims(1, rows, cols, x.size(), false);
  if (values.size() != x.size() || scales.size() != static_cast<size_t>(rows * (cols / kBlock))) {
    throw Error("fp8 quantizer: output spans of " + std::to_string(values.size()) + " values and " +
                std::to_string(scales.size()) + " scales; need " + std::to_string(x.size()) + " and " +
                std::to_string(rows * (cols / kBlock)));
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / kBlock; ++b) {
      const float* v = x.data() + r * cols + b * kBlock;
      float amax = 0.0f;
      for (int i = 0; i < kBlock; ++i) {
        if (!std::isfinite(v[i])) throw Error("fp8 quantizer: x" + block_name(0, r, b * kBlock + i) + " is not finite");
        amax = std::max(amax, std::fabs(v[i]));
      }
      const int32_t e = scale_exponent(amax);
      scales[static_cast<size_t>(r * (cols / kBlock) + b)] = encode_ue8m0(e);
      for (int i = 0; i < kBlock; ++i) values[static_cast<size_t>(r * cols + b * kBlock + i)] = encode_e4m3(std::ldexp(v[i], -e));
    }
  }
}

}  // namespace mok::fp8
