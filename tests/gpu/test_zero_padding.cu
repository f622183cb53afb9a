// The padding clear: on random data, exactly the rows no group owns become
// zeros (gaps between groups, an empty group's gap, the head before the first
// group, the tail after the last) and every owned row keeps its bytes.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu/gemm_test_support.hpp"
#include "gpu/gpu_test_env.hpp"
#include "mok/error.hpp"
#include "mok/zero_padding.hpp"

namespace {

using mok::gemm_test::DeviceBuffer;
using mok::gemm_test::Layout;

TEST(ZeroPadding, ClearsExactlyTheRowsNoGroupOwns) {
  MOK_REQUIRE_HOPPER();
  // Head of 5 rows, uneven groups (one empty, with padding after it), a tail of 9.
  const Layout layout = Layout::make({130, 0, 7, 200, 1}, {3, 5, 61, 0, 127}, 5, 9);
  const int64_t width = 96;  // bf16 columns: 192 bytes a row
  std::mt19937 rng(4);
  std::uniform_int_distribution<int> byte(1, 255);  // never zero: a cleared byte is visible
  std::vector<uint16_t> data(static_cast<size_t>(layout.m_total * width));
  for (auto& v : data) v = static_cast<uint16_t>(byte(rng) << 8 | byte(rng));
  DeviceBuffer<uint16_t> d_data(data);
  DeviceBuffer<int32_t> offset(layout.offset), rows(layout.rows);
  mok::ZeroPaddingArgs args;
  args.data = d_data.get();
  args.row_bytes = width * 2;
  args.m_total = layout.m_total;
  args.group_offset = offset.get();
  args.group_rows = rows.get();
  args.num_groups = layout.groups();
  mok::zero_padding_rows(args);
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = d_data.download();
  const std::vector<int> owner = layout.owner();
  int64_t cleared = 0;
  for (int64_t r = 0; r < layout.m_total; ++r) {
    for (int64_t c = 0; c < width; ++c) {
      const size_t at = static_cast<size_t>(r * width + c);
      if (owner[static_cast<size_t>(r)] < 0) {
        ASSERT_EQ(got[at], 0) << "row " << r << " belongs to no group and must be cleared";
      } else {
        ASSERT_EQ(got[at], data[at]) << "row " << r << " belongs to group " << owner[static_cast<size_t>(r)];
      }
    }
    cleared += owner[static_cast<size_t>(r)] < 0;
  }
  EXPECT_EQ(cleared, 5 + 3 + 5 + 61 + 0 + 127 + 9);
}

TEST(ZeroPadding, RejectsBadArguments) {
  mok::ZeroPaddingArgs good;
  good.data = reinterpret_cast<void*>(uintptr_t{1} << 20);
  good.row_bytes = 64;
  good.m_total = 10;
  good.group_offset = reinterpret_cast<const int32_t*>(uintptr_t{2} << 20);
  good.group_rows = reinterpret_cast<const int32_t*>(uintptr_t{3} << 20);
  good.num_groups = 2;
  EXPECT_NO_THROW(mok::validate_zero_padding(good));
  { auto x = good; x.row_bytes = 24; EXPECT_THROW(mok::validate_zero_padding(x), mok::Error); }
  { auto x = good; x.num_groups = 0; EXPECT_THROW(mok::validate_zero_padding(x), mok::Error); }
  { auto x = good; x.m_total = -1; EXPECT_THROW(mok::validate_zero_padding(x), mok::Error); }
  { auto x = good; x.data = reinterpret_cast<void*>(uintptr_t{1} << 20 | 8); EXPECT_THROW(mok::validate_zero_padding(x), mok::Error); }
}

}  // namespace
