// The GPU row quantizer against the host's (include/mok/fp8.hpp), byte for
// byte, on random bf16 rows whose blocks span many magnitudes (an all-zero
// block, blocks near the top and the bottom of the scale range, values that
// land on e4m3 subnormals), outputs poisoned first.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu/gemm_test_support.hpp"
#include "gpu/gpu_test_env.hpp"
#include "mok/bf16.hpp"
#include "mok/error.hpp"
#include "mok/fp8.hpp"
#include "mok/quantize_rows.hpp"

namespace {

using mok::gemm_test::DeviceBuffer;

TEST(QuantizeRows, EqualsTheHostQuantizerByteForByte) {
  MOK_REQUIRE_HOPPER();
  const int64_t rows = 301, cols = 1024, blocks = cols / 128;
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> octave(-120, 120);
  std::vector<uint16_t> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      // kind 0: zeros; 1: near the top of the range; 2: near the bottom;
      // 4: a subnormal block maximum (frexp's subnormal path); else random.
      const int kind = static_cast<int>((r * blocks + b) % 7);
      const float scale =
          kind == 0 ? 0.0f
                    : std::ldexp(1.0f, kind == 1 ? 120 : kind == 2 ? -120 : kind == 4 ? -130 : octave(rng));
      for (int64_t c = 0; c < 128; ++c) {
        // kind 3: one large value and many tiny ones (e4m3 subnormals after scaling)
        const float v = kind == 3 && c > 0 ? unit(rng) * scale * 1e-3f : unit(rng) * scale;
        x[static_cast<size_t>(r * cols + b * 128 + c)] = mok::float_to_bf16_bits(v);
      }
    }
  }
  std::vector<float> as_float(x.size());
  for (size_t i = 0; i < x.size(); ++i) as_float[i] = mok::bf16_bits_to_float(x[i]);
  std::vector<uint8_t> want_values(x.size()), want_scales(static_cast<size_t>(rows * blocks));
  mok::fp8::quantize_rows(as_float, rows, cols, want_values, want_scales);

  DeviceBuffer<uint16_t> d_x(x);
  DeviceBuffer<uint8_t> d_values(x.size()), d_scales(want_scales.size());
  for (int run = 0; run < 2; ++run) {
    MOK_CUDA_CHECK(cudaMemset(d_values.get(), 0x5A, x.size()));
    MOK_CUDA_CHECK(cudaMemset(d_scales.get(), 0xA5, want_scales.size()));
    mok::QuantizeRowsArgs args;
    args.x = d_x.get();
    args.values = d_values.get();
    args.scales = d_scales.get();
    args.rows = rows;
    args.cols = cols;
    mok::quantize_rows_e4m3(args);
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint8_t> values = d_values.download(), scales = d_scales.download();
    int bad = 0;
    for (size_t i = 0; i < scales.size(); ++i) {
      if (scales[i] != want_scales[i] && bad++ < 5) {
        ADD_FAILURE() << "block " << i << ": scale byte " << int{scales[i]} << ", host " << int{want_scales[i]};
      }
    }
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i] != want_values[i] && bad++ < 10) {
        ADD_FAILURE() << "element " << i << " (" << as_float[i] << "): byte " << int{values[i]} << ", host "
                      << int{want_values[i]};
      }
    }
    ASSERT_EQ(bad, 0) << "run " << run;
  }
}

TEST(QuantizeRows, RejectsBadArguments) {
  mok::QuantizeRowsArgs good;
  good.x = reinterpret_cast<const void*>(uintptr_t{1} << 20);
  good.values = reinterpret_cast<uint8_t*>(uintptr_t{2} << 20);
  good.scales = reinterpret_cast<uint8_t*>(uintptr_t{3} << 20);
  good.rows = 4;
  good.cols = 256;
  EXPECT_NO_THROW(mok::validate_quantize_rows(good));
  { auto a = good; a.cols = 192; EXPECT_THROW(mok::validate_quantize_rows(a), mok::Error); }
  { auto a = good; a.rows = -1; EXPECT_THROW(mok::validate_quantize_rows(a), mok::Error); }
  { auto a = good; a.values = reinterpret_cast<uint8_t*>((uintptr_t{2} << 20) + 4); EXPECT_THROW(mok::validate_quantize_rows(a), mok::Error); }
}

}  // namespace
