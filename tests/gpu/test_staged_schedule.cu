// The staged backward's row tables from a saved schedule
// (include/mok/staged_schedule.hpp) against a CPU model of its contract:
// ranks of uneven token counts, padding rows (home -1) inside each rank's
// schedule, garbage in the unused capacity past its end, entries no row
// holds (row 0 for them), outputs poisoned first and the same bytes on a
// second run; and bad arguments refused before anything runs.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu/gemm_test_support.hpp"
#include "gpu/gpu_test_env.hpp"
#include "mok/error.hpp"
#include "mok/staged_schedule.hpp"

namespace {

using mok::gemm_test::DeviceBuffer;

struct Saved {
  std::vector<std::vector<int32_t>> rows;  // per rank: [rows_per_rank][3]
  std::vector<int32_t> schedule_end;       // per rank
  std::vector<int64_t> tokens;             // per rank
};

// Each rank's schedule holds a shuffled share of the world's (token, slot)
// entries (a few left out, as a bad expert id leaves them) with padding rows
// between, then garbage up to the capacity.
Saved random_saved(int ranks, int64_t rows_per_rank, int k, std::mt19937& rng) {
  Saved s;
  for (int r = 0; r < ranks; ++r) s.tokens.push_back(40 + 13 * r);
  std::vector<std::array<int32_t, 3>> entries;  // (home, local token, slot)
  for (int r = 0; r < ranks; ++r) {
    for (int32_t t = 0; t < s.tokens[r]; ++t) {
      for (int32_t j = 0; j < k; ++j) entries.push_back({r, t, j});
    }
  }
  std::shuffle(entries.begin(), entries.end(), rng);
  entries.resize(entries.size() - 5);  // five entries no row holds
  std::uniform_int_distribution<int32_t> garbage(-7, 5000);
  size_t next = 0;
  for (int r = 0; r < ranks; ++r) {
    std::vector<int32_t> rows(static_cast<size_t>(rows_per_rank * 3));
    int64_t j = 0;
    const size_t share = (entries.size() + static_cast<size_t>(ranks) - 1) / static_cast<size_t>(ranks);
    for (size_t taken = 0; taken < share && next < entries.size() && j < rows_per_rank; ++j) {
      if (j % 9 == 4) {  // a padding row
        rows[3 * j] = -1;
        rows[3 * j + 1] = garbage(rng);
        rows[3 * j + 2] = garbage(rng);
        continue;
      }
      const auto& e = entries[next++];
      std::copy(e.begin(), e.end(), rows.begin() + 3 * j);
      ++taken;
    }
    s.schedule_end.push_back(static_cast<int32_t>(j));
    for (int64_t i = 3 * j; i < rows_per_rank * 3; ++i) rows[i] = garbage(rng);  // unused capacity
    s.rows.push_back(rows);
  }
  EXPECT_EQ(next, entries.size()) << "every remaining entry found a row";
  return s;
}

struct Tables {
  std::vector<int64_t> token_of_row, entry_of_row, row_of_entry;
};

Tables tables_on_cpu(const Saved& s, int64_t rows_per_rank, int k) {
  const int ranks = static_cast<int>(s.rows.size());
  std::vector<int64_t> first(ranks, 0);
  for (int r = 1; r < ranks; ++r) first[r] = first[r - 1] + s.tokens[r - 1];
  const int64_t entries = (first[ranks - 1] + s.tokens[ranks - 1]) * k;
  Tables t{std::vector<int64_t>(ranks * rows_per_rank), std::vector<int64_t>(ranks * rows_per_rank),
           std::vector<int64_t>(entries, 0)};
  for (int r = 0; r < ranks; ++r) {
    for (int64_t j = 0; j < rows_per_rank; ++j) {
      const int64_t i = r * rows_per_rank + j;
      const int32_t* row = s.rows[r].data() + 3 * j;
      const bool real = j < s.schedule_end[r] && row[0] >= 0;
      t.token_of_row[i] = real ? row[1] + first[row[0]] : 0;
      t.entry_of_row[i] = real ? t.token_of_row[i] * k + row[2] : entries;
      if (real) t.row_of_entry[t.entry_of_row[i]] = i;
    }
  }
  return t;
}

TEST(StagedSchedule, TablesMatchTheCpuModel) {
  MOK_REQUIRE_HOPPER();
  for (int ranks : {1, 3, 4}) {
    const int k = 6;
    const int64_t rows_per_rank = 700;
    std::mt19937 rng(50 + ranks);
    const Saved s = random_saved(ranks, rows_per_rank, k, rng);
    const Tables want = tables_on_cpu(s, rows_per_rank, k);
    std::vector<std::unique_ptr<DeviceBuffer<int32_t>>> rows, ends;
    mok::StagedScheduleArgs args;
    int64_t first = 0;
    for (int r = 0; r < ranks; ++r) {
      rows.push_back(std::make_unique<DeviceBuffer<int32_t>>(s.rows[r]));
      ends.push_back(std::make_unique<DeviceBuffer<int32_t>>(std::vector<int32_t>{s.schedule_end[r]}));
      args.rows[r] = rows.back()->get();
      args.schedule_end[r] = ends.back()->get();
      args.first_token[r] = first;
      first += s.tokens[r];
    }
    DeviceBuffer<int64_t> token_of_row(ranks * rows_per_rank), entry_of_row(ranks * rows_per_rank),
        row_of_entry(want.row_of_entry.size());
    args.ranks = ranks;
    args.rows_per_rank = rows_per_rank;
    args.tokens = first;
    args.k = k;
    args.token_of_row = token_of_row.get();
    args.entry_of_row = entry_of_row.get();
    args.row_of_entry = row_of_entry.get();
    for (int run = 0; run < 2; ++run) {
      for (auto* b : {&token_of_row, &entry_of_row, &row_of_entry}) {
        MOK_CUDA_CHECK(cudaMemset(b->get(), 0xFF, b->download().size() * sizeof(int64_t)));
      }
      mok::staged_schedule(args);
      MOK_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(token_of_row.download(), want.token_of_row) << ranks << " ranks, run " << run;
      EXPECT_EQ(entry_of_row.download(), want.entry_of_row) << ranks << " ranks, run " << run;
      EXPECT_EQ(row_of_entry.download(), want.row_of_entry) << ranks << " ranks, run " << run;
    }
  }
}

TEST(StagedSchedule, BadArgumentsAreRefusedBeforeTheLaunch) {
  mok::StagedScheduleArgs args;
  args.ranks = 0;
  EXPECT_THROW(mok::validate_staged_schedule(args), mok::Error);
  args.ranks = mok::kMaxScheduleRanks + 1;
  EXPECT_THROW(mok::validate_staged_schedule(args), mok::Error);
  args.ranks = 1;
  args.k = 0;
  EXPECT_THROW(mok::validate_staged_schedule(args), mok::Error);
  args.k = 2;
  EXPECT_THROW(mok::validate_staged_schedule(args), mok::Error) << "schedule_end[0] is null";
}

}  // namespace
