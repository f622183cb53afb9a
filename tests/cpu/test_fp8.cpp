// The block-scaled FP8 quantizer (include/mok/fp8.hpp): e4m3 rounding against
// a brute-force search over every e4m3 value, the power-of-two scale rule,
// and the weight quantizer's blocks and transposed copy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "mok/error.hpp"
#include "mok/fp8.hpp"
#include "quant/scale_exponent_rule.hpp"

namespace {

using namespace mok::fp8;

// The e4m3 code nearest to v (ties: the even code, i.e. mantissa bit 0 clear),
// saturating at +-448, by trying every finite code.
uint8_t brute_force_e4m3(float v) {
  if (std::fabs(v) >= kE4M3Max) return v < 0 ? 0xFE : 0x7E;
  uint8_t best = 0;
  double best_diff = INFINITY;
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;  // NaN
    const double d = std::fabs(static_cast<double>(decode_e4m3(static_cast<uint8_t>(code))) - v);
    const bool same_sign = std::signbit(decode_e4m3(static_cast<uint8_t>(code))) == std::signbit(v);
    if (!same_sign && d != 0) continue;
    if (d < best_diff || (d == best_diff && (code & 1) == 0 && (best & 1) == 1)) {
      best = static_cast<uint8_t>(code);
      best_diff = d;
    }
  }
  if (best_diff == 0 && decode_e4m3(best) == 0.0f) return std::signbit(v) ? 0x80 : 0x00;
  return best;
}

TEST(Fp8, EveryE4M3ValueRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(decode_e4m3(static_cast<uint8_t>(code))));
      continue;
    }
    EXPECT_EQ(encode_e4m3(decode_e4m3(static_cast<uint8_t>(code))), code) << code;
  }
  EXPECT_EQ(decode_e4m3(0x7E), 448.0f);
  EXPECT_EQ(decode_e4m3(0x01), 0x1p-9f);  // the smallest subnormal
  EXPECT_EQ(decode_e4m3(0x08), 0x1p-6f);  // the smallest normal
}

TEST(Fp8, EncodingIsTheNearestValueWithTiesToEven) {
  std::mt19937 rng(7);
  std::vector<float> probes;
  // Every midpoint between neighbouring values (the ties), and a hair either side.
  for (int code = 0; code < 0x7E; ++code) {
    const float lo = decode_e4m3(static_cast<uint8_t>(code)), hi = decode_e4m3(static_cast<uint8_t>(code + 1));
    const float mid = (lo + hi) / 2;
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)}) {
      probes.push_back(v);
      probes.push_back(-v);
    }
  }
  std::uniform_real_distribution<float> exponent(-12.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) probes.push_back((rng() & 1 ? -1.0f : 1.0f) * std::exp2(exponent(rng)));
  for (float v : {0.0f, -0.0f, 447.9f, 448.0f, 460.0f, 1e6f, -1e6f, INFINITY, -INFINITY}) probes.push_back(v);
  for (float v : probes) {
    ASSERT_EQ(encode_e4m3(v), brute_force_e4m3(v)) << v;
  }
  EXPECT_EQ(encode_e4m3(NAN), 0x7F);
}

TEST(Fp8, ScaleIsTheSmallestPowerOfTwoThatKeepsTheBlockInRange) {
  EXPECT_EQ(scale_exponent(0.0f), 0);
  EXPECT_EQ(scale_exponent(448.0f), 0);
  EXPECT_EQ(scale_exponent(std::nextafter(448.0f, 1000.0f)), 1);
  EXPECT_EQ(scale_exponent(224.0f), -1);
  EXPECT_EQ(scale_exponent(1.0f), -8);  // 1 / 2^-8 = 256 <= 448 < 512
  EXPECT_EQ(scale_exponent(1e-40f), -127);
  EXPECT_EQ(scale_exponent(3e38f), 120);  // 448 * 2^119 = 2.98e38 < 3e38 <= 448 * 2^120
  for (float amax : {1e-3f, 0.37f, 1.0f, 2.5f, 300.0f, 5000.0f}) {
    const int e = scale_exponent(amax);
    EXPECT_LE(amax, 448.0f * std::ldexp(1.0f, e)) << amax;
    EXPECT_GT(amax, 448.0f * std::ldexp(1.0f, e - 1)) << amax;
  }
  EXPECT_EQ(decode_ue8m0(encode_ue8m0(-8)), 0x1p-8f);
  EXPECT_TRUE(std::isnan(decode_ue8m0(0xFF)));
}

// The kernels' branch-free scale rule (quant/scale_exponent_rule.hpp) is the
// host's, input for input: every exponent field with the mantissas around the
// 1.75 boundary and at the ends, both signs, then a stride through all 2^32
// bit patterns. (+infinity, which the host refuses before asking, is checked
// against the kernels' own rule: the largest scale.)
TEST(Fp8, KernelScaleRuleOnTheBitsIsTheHostRule) {
  auto same = [](uint32_t bits) {
    float amax;
    std::memcpy(&amax, &bits, sizeof amax);
    if (std::isinf(amax) && amax > 0) return scale_exponent_of_bits(bits) == 127;
    return scale_exponent_of_bits(bits) == scale_exponent(amax);
  };
  int64_t checked = 0, wrong = 0;
  for (uint32_t sign : {0u, 1u}) {
    for (uint32_t field = 0; field < 256; ++field) {
      for (uint32_t mantissa : {0u, 1u, 2u, 0x3FFFFFu, 0x5FFFFFu, 0x600000u, 0x600001u, 0x7FFFFEu, 0x7FFFFFu}) {
        const uint32_t bits = (sign << 31) | (field << 23) | mantissa;
        ++checked;
        if (!same(bits)) {
          ++wrong;
          ADD_FAILURE() << "bits 0x" << std::hex << bits;
        }
      }
    }
  }
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 65521) {
    ++checked;
    if (!same(static_cast<uint32_t>(bits))) {
      ++wrong;
      ADD_FAILURE() << "bits 0x" << std::hex << bits;
    }
  }
  EXPECT_EQ(wrong, 0) << "of " << checked;
  EXPECT_GT(checked, 65000);
}

std::vector<float> random_weight(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(n));
  for (float& v : w) v = normal(rng);
  return w;
}

TEST(Fp8, WeightBlocksDequantizeWithinHalfAStepAndTransposeExactly) {
  const int64_t G = 2, R = 256, C = 384;
  std::vector<float> w = random_weight(G * R * C, 3);
  w[5] = 3.0f;  // one block with a much larger range
  const QuantizedWeight q = quantize_weight(w, G, R, C);
  ASSERT_EQ(q.scales.size(), static_cast<size_t>(G * 2 * 3));
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = 0; c < C; ++c) {
        const size_t i = static_cast<size_t>((g * R + r) * C + c);
        const float scale = decode_ue8m0(q.scales[static_cast<size_t>((g * 2 + r / 128) * 3 + c / 128)]);
        const float back = decode_e4m3(q.values[i]) * scale;
        // e4m3 keeps 3 mantissa bits: within 2^-4 relative, or one subnormal step of the scale.
        ASSERT_LE(std::fabs(back - w[i]), std::max(std::fabs(w[i]) * 0x1p-4f, scale * 0x1p-10f)) << i;
        ASSERT_EQ(q.values_t[static_cast<size_t>((g * C + c) * R + r)], q.values[i]);
      }
    }
  }
  // The transposed copy is the quantization of the transposed weight.
  std::vector<float> wt(w.size());
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = 0; c < C; ++c) wt[static_cast<size_t>((g * C + c) * R + r)] = w[static_cast<size_t>((g * R + r) * C + c)];
    }
  }
  const QuantizedWeight qt = quantize_weight(wt, G, C, R);
  EXPECT_EQ(qt.values, q.values_t);
  EXPECT_EQ(qt.scales, q.scales_t);
  EXPECT_EQ(qt.values_t, q.values);
  // The block holding 3.0 has its own, larger scale; its neighbours do not.
  EXPECT_EQ(decode_ue8m0(q.scales[0]), std::ldexp(1.0f, scale_exponent(3.0f)));
  EXPECT_LT(decode_ue8m0(q.scales[1]), decode_ue8m0(q.scales[0]));
}

// Blocks never span two groups: quantizing each group (expert) on its own
// gives the bytes of quantizing all of them at once. The fused FP8 forward's
// weight upload (src/world/fp8_weights.cu) quantizes expert by expert in
// parallel and relies on it to match the CPU reference, which quantizes all
// experts in one call.
TEST(Fp8, EachGroupQuantizesAsItsOwnWeight) {
  const int64_t G = 3, R = 256, C = 128;
  std::vector<float> w = random_weight(G * R * C, 6);
  w[static_cast<size_t>(R * C + 17)] = -5.0f;  // group 1 alone has a wide block
  const QuantizedWeight all = quantize_weight(w, G, R, C);
  std::vector<uint8_t> values, scales;
  for (int64_t g = 0; g < G; ++g) {
    const QuantizedWeight one =
        quantize_weight(std::span<const float>(w.data() + g * R * C, static_cast<size_t>(R * C)), 1, R, C);
    values.insert(values.end(), one.values.begin(), one.values.end());
    scales.insert(scales.end(), one.scales.begin(), one.scales.end());
  }
  EXPECT_EQ(values, all.values);
  EXPECT_EQ(scales, all.scales);
}

TEST(Fp8, RowsAreQuantizedInBlocksOf128) {
  const int64_t R = 3, C = 256;
  std::vector<float> x = random_weight(R * C, 4);
  x[C + 200] = -7.0f;  // row 1, block 1
  std::vector<uint8_t> values(x.size()), scales(static_cast<size_t>(R * 2));
  quantize_rows(x, R, C, values, scales);
  EXPECT_EQ(decode_ue8m0(scales[3]), std::ldexp(1.0f, scale_exponent(7.0f)));
  EXPECT_EQ(values[static_cast<size_t>(C + 200)], encode_e4m3(std::ldexp(-7.0f, -scale_exponent(7.0f))));
  for (size_t b = 0; b < scales.size(); ++b) {
    if (b != 3) EXPECT_LT(decode_ue8m0(scales[b]), decode_ue8m0(scales[3])) << b;
  }
}

TEST(Fp8, BadInputIsRefused) {
  std::vector<float> w = random_weight(128 * 128, 5);
  EXPECT_THROW(quantize_weight(w, 1, 64, 256), mok::Error);  // rows not a multiple of 128
  EXPECT_THROW(quantize_weight(w, 2, 128, 128), mok::Error);  // size mismatch
  w[77] = NAN;
  try {
    quantize_weight(w, 1, 128, 128);
    ADD_FAILURE() << "a NaN weight was accepted";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight[0, 0, 77] is not finite"), std::string::npos) << e.what();
  }
  std::vector<uint8_t> values(10), scales(1);
  EXPECT_THROW(quantize_rows(w, 1, 100, values, scales), mok::Error);
}

}  // namespace

namespace {

// A weight both quantizers can build bit for bit (a float32 division is
// correctly rounded everywhere; powers of two scale exactly), and the FNV-1a
// hash of everything quantized from it. python/tests/test_quant.py checks the
// torch quantizer against the same constant: the two are one quantizer.
std::vector<float> shared_test_weight() {
  const int64_t n = 2 * 256 * 384;
  std::vector<float> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float num = static_cast<float>((i * 7919) % 2003 - 1001);
    w[static_cast<size_t>(i)] = std::ldexp(num / 977.0f, static_cast<int>((i / (128 * 384)) % 5) - 2);
  }
  return w;
}

uint64_t fnv1a(const std::vector<std::vector<uint8_t>>& parts) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& part : parts) {
    for (uint8_t b : part) h = (h ^ b) * 1099511628211ull;
  }
  return h;
}

}  // namespace

TEST(Fp8, TheSharedTestWeightQuantizesToTheGoldenBytes) {
  const QuantizedWeight q = quantize_weight(shared_test_weight(), 2, 256, 384);
  const uint64_t h = fnv1a({q.values, q.scales, q.values_t, q.scales_t});
  std::printf("[ info ] fp8 golden hash %016llx\n", static_cast<unsigned long long>(h));
  EXPECT_EQ(h, 0x58d5a7ab2986f80dull);
}
