// The deterministic schedule: completeness, order, padding, determinism and
// independence from the host thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "mok/error.hpp"
#include "mok/presets.hpp"
#include "mok/schedule.hpp"

namespace {

// Routing ids for every rank: distinct experts per token, drawn uniformly or
// piled onto the low expert ids (skew), from a fixed seed.
struct WorldRouting {
  mok::LayerConfig config;
  std::vector<std::vector<int32_t>> ids;

  WorldRouting(mok::LayerConfig c, uint64_t seed, bool skewed) : config(std::move(c)) {
    std::mt19937_64 rng(seed);
    const int E = config.num_experts, k = config.top_k;
    for (int r = 0; r < config.world_size; ++r) {
      std::vector<int32_t> rank_ids;
      for (int t = 0; t < config.tokens_per_rank[r]; ++t) {
        std::vector<int32_t> experts(E);
        std::iota(experts.begin(), experts.end(), 0);
        if (skewed) {
          // Mostly the first k experts, so a few experts get almost every row.
          if (rng() % 8 != 0) {
            std::shuffle(experts.begin(), experts.begin() + k, rng);
          } else {
            std::shuffle(experts.begin(), experts.end(), rng);
          }
        } else {
          std::shuffle(experts.begin(), experts.end(), rng);
        }
        rank_ids.insert(rank_ids.end(), experts.begin(), experts.begin() + k);
      }
      ids.push_back(std::move(rank_ids));
    }
  }

  std::vector<mok::RankRouting> views() const {
    std::vector<mok::RankRouting> v;
    for (int r = 0; r < config.world_size; ++r) v.push_back({ids[r].data(), nullptr, config.tokens_per_rank[r]});
    return v;
  }
};

mok::WorldSchedule build(const WorldRouting& w, int tile_rows, int threads = 1) {
  const auto views = w.views();
  return mok::build_schedule(w.config, views, {tile_rows, threads});
}

// Checks every structural property of a schedule against its routing.
void check_schedule(const WorldRouting& w, const mok::WorldSchedule& s, int tile_rows) {
  const mok::LayerConfig& c = w.config;
  const int k = c.top_k;
  ASSERT_EQ(static_cast<int>(s.ranks.size()), c.world_size);
  ASSERT_EQ(s.top_k, k);
  // seen[home][token * k + slot]: how many schedule rows name that entry.
  std::vector<std::vector<int>> seen(c.world_size);
  for (int r = 0; r < c.world_size; ++r) seen[r].assign(w.ids[r].size(), 0);

  for (const mok::RankSchedule& rs : s.ranks) {
    ASSERT_EQ(rs.num_local_experts, c.experts_per_rank());
    ASSERT_EQ(rs.first_expert, rs.rank * c.experts_per_rank());
    ASSERT_EQ(rs.expert_offset.size(), static_cast<size_t>(rs.num_local_experts) + 1);
    ASSERT_EQ(static_cast<int32_t>(rs.rows.size()), rs.padded_rows());
    ASSERT_EQ(rs.expert_offset.front(), 0);
    for (int e = 0; e < rs.num_local_experts; ++e) {
      const int32_t begin = rs.expert_offset[e], end = rs.expert_offset[e + 1];
      const int32_t real = rs.expert_rows[e];
      // Padding only at the expert's end, to the next multiple of tile_rows.
      EXPECT_EQ(end - begin, (real + tile_rows - 1) / tile_rows * tile_rows);
      for (int32_t row = begin; row < end; ++row) {
        const mok::RowSource& src = rs.rows[row];
        if (row >= begin + real) {
          EXPECT_TRUE(mok::is_padding(src)) << "row " << row;
          continue;
        }
        ASSERT_FALSE(mok::is_padding(src)) << "padding inside expert " << e << " at row " << row;
        ASSERT_GE(src.rank, 0);
        ASSERT_LT(src.rank, c.world_size);
        ASSERT_GE(src.token, 0);
        ASSERT_LT(src.token, c.tokens_per_rank[src.rank]);
        ASSERT_GE(src.slot, 0);
        ASSERT_LT(src.slot, k);
        const int64_t entry = static_cast<int64_t>(src.token) * k + src.slot;
        // The row belongs to this expert, and combine finds it here.
        EXPECT_EQ(w.ids[src.rank][entry], rs.first_expert + e);
        EXPECT_EQ(s.combine_row[src.rank][entry], row);
        ++seen[src.rank][entry];
        // Rows ordered by (home rank, token): global token order.
        if (row > begin) {
          const mok::RowSource& prev = rs.rows[row - 1];
          EXPECT_LT(std::tie(prev.rank, prev.token), std::tie(src.rank, src.token)) << "row " << row;
        }
      }
    }
  }
  // Every (rank, token, slot) appears exactly once in the whole world.
  for (int r = 0; r < c.world_size; ++r) {
    for (size_t entry = 0; entry < seen[r].size(); ++entry) {
      ASSERT_EQ(seen[r][entry], 1) << "rank " << r << " entry " << entry;
    }
  }
}

bool same_schedule(const mok::WorldSchedule& a, const mok::WorldSchedule& b) {
  if (a.ranks.size() != b.ranks.size() || a.combine_row != b.combine_row) return false;
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    const auto &x = a.ranks[r], &y = b.ranks[r];
    if (x.expert_rows != y.expert_rows || x.expert_offset != y.expert_offset) return false;
    if (!std::equal(x.rows.begin(), x.rows.end(), y.rows.begin(), y.rows.end(),
                    [](const mok::RowSource& p, const mok::RowSource& q) {
                      return p.rank == q.rank && p.token == q.token && p.slot == q.slot;
                    })) {
      return false;
    }
  }
  return true;
}

TEST(Schedule, PropertiesHoldAcrossWorldsTilesAndSkew) {
  uint64_t seed = 1;
  for (int world : {1, 2, 4, 8}) {
    for (int tile : {1, 7, 64, 128}) {
      for (bool skewed : {false, true}) {
        auto config = mok::make_config(mok::find_shape("medium"), world, 0);
        for (int r = 0; r < world; ++r) config.tokens_per_rank[r] = 40 + 13 * r;
        WorldRouting w(config, seed++, skewed);
        SCOPED_TRACE(testing::Message() << "R=" << world << " tile=" << tile << " skewed=" << skewed);
        check_schedule(w, build(w, tile), tile);
      }
    }
  }
}

TEST(Schedule, HandlesEmptyAndSingleTokenRanks) {
  auto config = mok::make_config(mok::find_shape("small"), std::vector<int>{0, 1, 0, 9});
  WorldRouting w(config, 42, false);
  const auto s = build(w, 16);
  check_schedule(w, s, 16);
  EXPECT_TRUE(s.combine_row[0].empty());
  EXPECT_EQ(s.combine_row[1].size(), 2u);
}

TEST(Schedule, AllTokensToOneExpertStaysComplete) {
  auto config = mok::make_config(mok::find_shape("small"), 4, 100);
  WorldRouting w(config, 7, false);
  for (auto& rank_ids : w.ids) {
    for (size_t n = 0; n < rank_ids.size(); n += 2) {
      rank_ids[n] = 5;      // every token's slot 0 on expert 5
      rank_ids[n + 1] = 2;  // and slot 1 on expert 2
    }
  }
  const auto s = build(w, 128);
  check_schedule(w, s, 128);
  EXPECT_EQ(s.ranks[2].expert_rows[1], 400);  // expert 5 is rank 2's local expert 1
  EXPECT_EQ(s.ranks[1].expert_rows[0], 400);  // expert 2 is rank 1's local expert 0
  EXPECT_EQ(s.ranks[0].padded_rows(), 0);
  EXPECT_EQ(s.ranks[3].padded_rows(), 0);
}

TEST(Schedule, SameRoutingGivesTheSameSchedule) {
  auto config = mok::make_config(mok::find_shape("medium"), 4, 300);
  WorldRouting w(config, 99, true);
  const auto first = build(w, 64);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(same_schedule(first, build(w, 64)));
}

TEST(Schedule, UnaffectedByThreadCount) {
  auto config = mok::make_config(mok::find_shape("medium"), 8, 0);
  for (int r = 0; r < 8; ++r) config.tokens_per_rank[r] = 17 * r;
  WorldRouting w(config, 5, false);
  const auto serial = build(w, 32, 1);
  for (int threads : {2, 3, 8, 16}) EXPECT_TRUE(same_schedule(serial, build(w, 32, threads))) << threads;
}

TEST(Schedule, ExpertRowOrderIsInvariantAcrossWorldSizes) {
  // The same global batch split over R = 1, 2, 4 ranks: every expert receives
  // the same global tokens in the same order, so a reduction over its rows
  // gives the same bits at any EP degree.
  const int global_tokens = 96;
  auto base = mok::make_config(mok::find_shape("small"), 1, global_tokens);
  WorldRouting global(base, 11, false);
  const auto reference = build(global, 1);
  for (int world : {2, 4}) {
    auto config = mok::make_config(mok::find_shape("small"), world, global_tokens / world);
    WorldRouting split(config, 0, false);
    for (int r = 0; r < world; ++r) {
      const auto first = global.ids[0].begin() + static_cast<long>(r) * (global_tokens / world) * config.top_k;
      split.ids[r].assign(first, first + (global_tokens / world) * config.top_k);
    }
    const auto s = build(split, 1);
    for (int expert = 0; expert < config.num_experts; ++expert) {
      const auto& owner = s.ranks[config.expert_owner(expert)];
      const int local = expert - owner.first_expert;
      std::vector<int> split_tokens, global_tokens_of_expert;
      for (int32_t row = owner.expert_offset[local]; row < owner.expert_offset[local + 1]; ++row) {
        split_tokens.push_back(owner.rows[row].rank * (global_tokens / world) + owner.rows[row].token);
      }
      for (int32_t row = reference.ranks[0].expert_offset[expert];
           row < reference.ranks[0].expert_offset[expert + 1]; ++row) {
        global_tokens_of_expert.push_back(reference.ranks[0].rows[row].token);
      }
      EXPECT_EQ(split_tokens, global_tokens_of_expert) << "R=" << world << " expert " << expert;
    }
  }
}

TEST(Schedule, RejectsBadOptions) {
  auto config = mok::make_config(mok::find_shape("small"), 1, 4);
  WorldRouting w(config, 1, false);
  const auto views = w.views();
  EXPECT_THROW(mok::build_schedule(config, views, {0, 1}), mok::Error);
  EXPECT_THROW(mok::build_schedule(config, views, {64, 0}), mok::Error);
}

}  // namespace
