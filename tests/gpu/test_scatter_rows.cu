// The row scatter against a CPU model of its contract: each claimed row is
// its token's source row bit for bit, every other row is zero; with rows
// claimed by nobody (padding), entries whose indices disagree (what a bad
// expert id leaves in a schedule), out-of-range indices, one and several
// sources, outputs poisoned first, and the same bytes on a second run; and
// unclaimed rows left as they were when the caller asks (zero_unclaimed_rows).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu/gemm_test_support.hpp"
#include "gpu/gpu_test_env.hpp"
#include "mok/error.hpp"
#include "mok/scatter_rows.hpp"

namespace {

using mok::gemm_test::DeviceBuffer;
using mok::gemm_test::random_bf16;

// A schedule as the staged backward builds one: T k entries spread over
// num_rows >= T k rows in a random order, the rest padding (entry_of_row
// pointing at the dummy entry T k), plus a few corrupted indices.
struct Schedule {
  std::vector<int64_t> row_of_entry, entry_of_row;
};

Schedule random_schedule(int64_t tokens, int k, int64_t num_rows, std::mt19937& rng) {
  const int64_t entries = tokens * k;
  std::vector<int64_t> rows(static_cast<size_t>(num_rows));
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), rng);
  Schedule s{std::vector<int64_t>(static_cast<size_t>(entries)),
             std::vector<int64_t>(static_cast<size_t>(num_rows), entries)};
  for (int64_t e = 0; e < entries; ++e) {
    s.row_of_entry[e] = rows[e];
    s.entry_of_row[rows[e]] = e;
  }
  // An entry kept out of the schedule points at row 0 (as saved_schedule
  // leaves it), which another entry holds; indices out of range both ways.
  s.row_of_entry[3] = s.row_of_entry[5];
  s.row_of_entry[7] = num_rows + 2;
  s.row_of_entry[9] = -4;
  s.entry_of_row[s.row_of_entry[11]] = entries + 100;
  return s;
}

std::vector<uint16_t> scatter_on_cpu(const std::vector<uint16_t>& src, const Schedule& s, int64_t tokens, int k,
                                     int64_t num_rows, int64_t width) {
  std::vector<uint16_t> out(static_cast<size_t>(num_rows * width), 0);
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t e = s.entry_of_row[r];
    if (e < 0 || e >= tokens * k || s.row_of_entry[e] != r) continue;
    std::copy_n(src.begin() + (e / k) * width, width, out.begin() + r * width);
  }
  return out;
}

// The arguments of a scatter over schedule indices already on the device;
// the caller adds its sources and outputs.
mok::ScatterRowsArgs schedule_args(const DeviceBuffer<int64_t>& row_of_entry,
                                   const DeviceBuffer<int64_t>& entry_of_row, int64_t tokens, int k,
                                   int64_t num_rows, int64_t width) {
  mok::ScatterRowsArgs args;
  args.row_of_entry = row_of_entry.get();
  args.entry_of_row = entry_of_row.get();
  args.tokens = tokens;
  args.k = k;
  args.num_rows = num_rows;
  args.width = width;
  return args;
}

TEST(ScatterRows, EachClaimedRowIsItsTokensRowAndTheRestZero) {
  MOK_REQUIRE_HOPPER();
  const int64_t tokens = 301, width = 7168 / 4 + 64;  // not a multiple of the block's 128 chunks
  const int k = 8;
  const int64_t num_rows = tokens * k + 97;
  std::mt19937 rng(31);
  const Schedule s = random_schedule(tokens, k, num_rows, rng);
  const std::vector<uint16_t> x = random_bf16(tokens * width, rng, 2.0f);
  const std::vector<uint16_t> dout = random_bf16(tokens * width, rng, 0.5f);
  DeviceBuffer<uint16_t> d_x(x), d_dout(dout), d_x_rows(num_rows * width), d_dout_rows(num_rows * width);
  DeviceBuffer<int64_t> d_row_of_entry(s.row_of_entry), d_entry_of_row(s.entry_of_row);
  const std::vector<uint16_t> want_x = scatter_on_cpu(x, s, tokens, k, num_rows, width);
  const std::vector<uint16_t> want_dout = scatter_on_cpu(dout, s, tokens, k, num_rows, width);
  ASSERT_GT(std::count(want_x.begin(), want_x.end(), uint16_t{0}), 97 * width) << "padding rows are in the test";
  for (int sources : {1, 2}) {
    std::vector<uint16_t> first;
    for (int run = 0; run < 2; ++run) {
      MOK_CUDA_CHECK(cudaMemset(d_x_rows.get(), 0xFF, num_rows * width * 2));
      MOK_CUDA_CHECK(cudaMemset(d_dout_rows.get(), 0xFF, num_rows * width * 2));
      mok::ScatterRowsArgs args = schedule_args(d_row_of_entry, d_entry_of_row, tokens, k, num_rows, width);
      args.sources[0] = d_dout.get();
      args.outs[0] = d_dout_rows.get();
      args.sources[1] = d_x.get();
      args.outs[1] = d_x_rows.get();
      args.num_sources = sources;
      mok::scatter_rows(args);
      MOK_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<uint16_t> got = d_dout_rows.download();
      EXPECT_EQ(got, want_dout) << sources << " source(s), run " << run;
      if (sources == 2) {
        EXPECT_EQ(d_x_rows.download(), want_x) << "run " << run;
      } else {
        const std::vector<uint16_t> untouched = d_x_rows.download();
        EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](uint16_t v) { return v == 0xFFFF; }))
            << "one source writes one output";
      }
      if (run == 0) first = got;
      else EXPECT_EQ(got, first) << "the same bytes every run";
    }
  }
}

TEST(ScatterRows, LeavesUnclaimedRowsAloneWhenAskedTo) {
  MOK_REQUIRE_HOPPER();
  const int64_t tokens = 77, width = 512;
  const int k = 6;
  const int64_t num_rows = tokens * k + 131;
  std::mt19937 rng(37);
  const Schedule s = random_schedule(tokens, k, num_rows, rng);
  const std::vector<uint16_t> x = random_bf16(tokens * width, rng, 2.0f);
  std::vector<uint16_t> want = scatter_on_cpu(x, s, tokens, k, num_rows, width);
  // Rows nobody claims keep the poison the output started with.
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t e = s.entry_of_row[r];
    if (e < 0 || e >= tokens * k || s.row_of_entry[e] != r) std::fill_n(want.begin() + r * width, width, 0xFFFF);
  }
  DeviceBuffer<uint16_t> d_x(x), d_out(num_rows * width);
  DeviceBuffer<int64_t> d_row_of_entry(s.row_of_entry), d_entry_of_row(s.entry_of_row);
  MOK_CUDA_CHECK(cudaMemset(d_out.get(), 0xFF, num_rows * width * 2));
  mok::ScatterRowsArgs args = schedule_args(d_row_of_entry, d_entry_of_row, tokens, k, num_rows, width);
  args.sources[0] = d_x.get();
  args.outs[0] = d_out.get();
  args.num_sources = 1;
  args.zero_unclaimed_rows = false;
  mok::scatter_rows(args);
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(d_out.download(), want);
  // With no tokens there is nothing to launch, and nothing changes.
  args.tokens = 0;
  mok::scatter_rows(args);
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(d_out.download(), want);
}

TEST(ScatterRows, NoTokensZeroesEveryRow) {
  MOK_REQUIRE_HOPPER();
  const int64_t num_rows = 70, width = 64;
  DeviceBuffer<uint16_t> d_out(num_rows * width);
  DeviceBuffer<int64_t> d_entry_of_row(std::vector<int64_t>(num_rows, 0));
  MOK_CUDA_CHECK(cudaMemset(d_out.get(), 0xFF, num_rows * width * 2));
  mok::ScatterRowsArgs args;
  args.outs[0] = d_out.get();
  args.num_sources = 1;
  args.entry_of_row = d_entry_of_row.get();
  args.k = 4;
  args.num_rows = num_rows;
  args.width = width;
  mok::scatter_rows(args);
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = d_out.download();
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](uint16_t v) { return v == 0; }));
}

TEST(ScatterRows, RejectsBadArguments) {
  const auto at = [](uintptr_t offset) { return reinterpret_cast<void*>((uintptr_t{1} << 20) + offset); };
  mok::ScatterRowsArgs good;
  good.sources[0] = at(0);
  good.outs[0] = at(0);
  good.num_sources = 1;
  good.row_of_entry = static_cast<const int64_t*>(at(0));
  good.entry_of_row = static_cast<const int64_t*>(at(0));
  good.tokens = 2;
  good.k = 2;
  good.num_rows = 4;
  good.width = 64;
  EXPECT_NO_THROW(mok::validate_scatter_rows(good));
  { auto x = good; x.width = 12; EXPECT_THROW(mok::validate_scatter_rows(x), mok::Error); }
  { auto x = good; x.num_sources = 0; EXPECT_THROW(mok::validate_scatter_rows(x), mok::Error); }
  { auto x = good; x.num_sources = 5; EXPECT_THROW(mok::validate_scatter_rows(x), mok::Error); }
  { auto x = good; x.k = 0; EXPECT_THROW(mok::validate_scatter_rows(x), mok::Error); }
  { auto x = good; x.k = 65; EXPECT_THROW(mok::validate_scatter_rows(x), mok::Error); }
  { auto x = good; x.outs[0] = at(8); EXPECT_THROW(mok::validate_scatter_rows(x), mok::Error); }
  { auto x = good; x.sources[0] = nullptr; EXPECT_THROW(mok::validate_scatter_rows(x), mok::Error); }
  { auto x = good; x.entry_of_row = static_cast<const int64_t*>(at(4)); EXPECT_THROW(mok::validate_scatter_rows(x), mok::Error); }
  { auto x = good; x.num_sources = 2; EXPECT_THROW(mok::validate_scatter_rows(x), mok::Error) << "outs[1] is null"; }
}

}  // namespace
