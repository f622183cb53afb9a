// The row combine against a CPU model of the same arithmetic (fp32 sums in
// slot order, one round-to-nearest-even to bf16): equal bit for bit, with
// negative indices skipped, with and without a base, output poisoned first.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu/gemm_test_support.hpp"
#include "gpu/gpu_test_env.hpp"
#include "mok/bf16.hpp"
#include "mok/error.hpp"
#include "mok/row_combine.hpp"

namespace {

using mok::gemm_test::DeviceBuffer;
using mok::gemm_test::random_bf16;

std::vector<uint16_t> combine_on_cpu(const std::vector<uint16_t>& rows, const std::vector<int32_t>& index,
                                     const std::vector<uint16_t>* base, int64_t tokens, int k, int64_t width) {
  std::vector<uint16_t> out(tokens * width);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < width; ++c) {
      float acc = 0.0f;  // as the kernel: the base is added to a zero (so -0 becomes +0 alike)
      if (base != nullptr) acc += mok::bf16_bits_to_float((*base)[t * width + c]);
      for (int j = 0; j < k; ++j) {
        const int32_t r = index[t * k + j];
        if (r >= 0) acc += mok::bf16_bits_to_float(rows[r * width + c]);
      }
      out[t * width + c] = mok::float_to_bf16_bits(acc);
    }
  }
  return out;
}

TEST(RowCombine, EqualsTheSlotOrderedFp32SumBitForBit) {
  MOK_REQUIRE_HOPPER();
  const int64_t tokens = 333, width = 1024;
  const int k = 6;
  const int64_t num_rows = tokens * k + 17;
  std::mt19937 rng(12);
  const std::vector<uint16_t> rows = random_bf16(num_rows * width, rng, 3.0f);
  const std::vector<uint16_t> base = random_bf16(tokens * width, rng, 3.0f);
  std::vector<int32_t> index(tokens * k);
  std::uniform_int_distribution<int32_t> pick(-1, static_cast<int32_t>(num_rows) - 1);
  for (auto& i : index) i = pick(rng);  // some -1: no contribution
  DeviceBuffer<uint16_t> d_rows(rows), d_base(base), d_out(tokens * width);
  DeviceBuffer<int32_t> d_index(index);
  for (bool with_base : {true, false}) {
    MOK_CUDA_CHECK(cudaMemset(d_out.get(), 0xFF, tokens * width * 2));
    mok::RowCombineArgs args;
    args.rows = d_rows.get();
    args.row_index = d_index.get();
    args.base = with_base ? d_base.get() : nullptr;
    args.out = d_out.get();
    args.num_rows = num_rows;
    args.tokens = tokens;
    args.k = k;
    args.width = width;
    mok::row_combine(args);
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> want = combine_on_cpu(rows, index, with_base ? &base : nullptr, tokens, k, width);
    EXPECT_EQ(d_out.download(), want) << (with_base ? "with base" : "without base");
  }
}

TEST(RowCombine, RejectsBadArguments) {
  mok::RowCombineArgs good;
  good.rows = reinterpret_cast<const void*>(uintptr_t{1} << 20);
  good.row_index = reinterpret_cast<const int32_t*>(uintptr_t{1} << 20);
  good.out = reinterpret_cast<void*>(uintptr_t{1} << 20);
  good.num_rows = 4;
  good.tokens = 2;
  good.k = 2;
  good.width = 64;
  EXPECT_NO_THROW(mok::validate_row_combine(good));
  { auto x = good; x.width = 12; EXPECT_THROW(mok::validate_row_combine(x), mok::Error); }
  { auto x = good; x.out = nullptr; EXPECT_THROW(mok::validate_row_combine(x), mok::Error); }
  { auto x = good; x.base = reinterpret_cast<const char*>(good.out) + 2; EXPECT_THROW(mok::validate_row_combine(x), mok::Error); }
  { auto x = good; x.k = -1; EXPECT_THROW(mok::validate_row_combine(x), mok::Error); }
}

}  // namespace
