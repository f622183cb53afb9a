// The fused backward's options and workspace (src/world/backward_layout.hpp),
// with no GPU: its dispatch default and whole-schedule buffers; every rank's
// regions aligned, in bounds and disjoint, sized as the kernel reads them;
// ranks side by side in one allocation; the bounds refuse what they should.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "hopper_kernel_facts.hpp"
#include "layout_checks.hpp"
#include "mok/error.hpp"
#include "mok/presets.hpp"
#include "protocol/counters.hpp"
#include "world/backward_layout.hpp"

namespace {

using mok::world::KernelFacts;

KernelFacts hopper_kernel() { return mok::test_support::hopper_kernel_facts(); }

// Options as resolve_options leaves them: every default filled in.
mok::FusedForwardOptions resolved(int minibatch_rows, int ctas, int comm) {
  mok::FusedForwardOptions o;
  o.minibatch_rows = minibatch_rows;
  o.ring_slots = 4;
  o.lookahead = 2;
  o.ctas_per_rank = ctas;
  o.comm_ctas_per_rank = comm;
  return o;
}

TEST(BackwardLayout, DispatchesWithTwiceTheForwardsCtasUnlessTheCallerChose) {
  const auto config = mok::make_config(mok::find_shape("deepseek-v3"), std::vector<int>{4096});
  const KernelFacts kernel = hopper_kernel();
  const mok::FusedForwardOptions caller;  // comm_ctas_per_rank 0: the default
  EXPECT_EQ(mok::world::backward_options(config, caller, resolved(2048, 132, 4), kernel).comm_ctas_per_rank, 8);
  // At most a quarter of the rank's CTAs, at least one.
  EXPECT_EQ(mok::world::backward_options(config, caller, resolved(2048, 16, 6), kernel).comm_ctas_per_rank, 4);
  EXPECT_EQ(mok::world::backward_options(config, caller, resolved(2048, 3, 1), kernel).comm_ctas_per_rank, 1);
  // The caller's own number stands.
  mok::FusedForwardOptions chose;
  chose.comm_ctas_per_rank = 3;
  EXPECT_EQ(mok::world::backward_options(config, chose, resolved(2048, 132, 3), kernel).comm_ctas_per_rank, 3);
}

TEST(BackwardLayout, BuffersHoldTheWholeSchedule) {
  for (int minibatch : {128, 512, 2048, 4096}) {
    for (const std::vector<int>& tokens : {std::vector<int>{4096}, std::vector<int>{0, 1, 300, 77}}) {
      SCOPED_TRACE(testing::Message() << "minibatch " << minibatch << ", ranks " << tokens.size());
      const auto config = mok::make_config(mok::find_shape("deepseek-v3"), tokens);
      const KernelFacts kernel = hopper_kernel();
      const auto o = mok::world::backward_options(config, {}, resolved(minibatch, 132 / config.world_size, 4), kernel);
      const auto L = mok::world::backward_layout(config, o, kernel);
      const int64_t capacity = mok::world::schedule_row_capacity(config, kernel);
      EXPECT_EQ(L.row_capacity, capacity);
      EXPECT_EQ(L.buffer_rows, static_cast<int64_t>(o.ring_slots) * minibatch);
      EXPECT_GE(L.buffer_rows, capacity);
      EXPECT_LT(L.buffer_rows - capacity, minibatch);  // no more minibatches than needed
      // The table's rule: enough slots for every m-tile of the largest schedule.
      for (const auto& rank : L.ranks) {
        auto g = rank.geometry;
        g.padded_rows = static_cast<int32_t>(capacity / kernel.tile_m * kernel.tile_m);
        EXPECT_TRUE(mok::protocol::buffers_hold_schedule(g));
      }
    }
  }
}

TEST(BackwardLayout, RegionsAreAlignedDisjointAndInsideTheAllocation) {
  for (const char* preset : {"tiny", "small", "medium", "deepseek-v3"}) {
    SCOPED_TRACE(preset);
    const auto config = mok::make_config(mok::find_shape(preset), std::vector<int>{0, 1, 300, 4096});
    const KernelFacts kernel = hopper_kernel();
    const auto L = mok::world::backward_layout(
        config, mok::world::backward_options(config, {}, resolved(256, 33, 4), kernel), kernel);
    ASSERT_EQ(L.ranks.size(), 4u);
    size_t rank_end = 0;
    for (size_t r = 0; r < L.ranks.size(); ++r) {
      SCOPED_TRACE(testing::Message() << "rank " << r);
      EXPECT_EQ(L.rank_offset[r] % mok::world::kRegionAlignment, 0u);
      EXPECT_GE(L.rank_offset[r], rank_end) << "overlaps the rank before it";
      mok::test_support::expect_aligned_disjoint_and_inside(mok::world::regions(L.ranks[r]), L.ranks[r].bytes);
      rank_end = L.rank_offset[r] + L.ranks[r].bytes;
    }
    EXPECT_LE(rank_end, L.bytes);
  }
}

TEST(BackwardLayout, SizesAreWhatTheKernelReads) {
  // small: H 256, I 128, 8 experts, top-2, one shared expert of width 128.
  const auto config = mok::make_config(mok::find_shape("small"), std::vector<int>{100, 37});
  const KernelFacts kernel = hopper_kernel();
  const auto o = mok::world::backward_options(config, {}, resolved(256, 66, 3), kernel);
  const auto L = mok::world::backward_layout(config, o, kernel);
  const size_t H = 256, I = 128, S = 128, k = 2, T = 100;
  const size_t P = static_cast<size_t>(L.buffer_rows);
  EXPECT_EQ(L.row_capacity, (100 + 37) * 2 + 4 * 127);
  EXPECT_EQ(P, 1024u);  // 782 rows of capacity: four minibatches of 256
  EXPECT_EQ(L.parts, 1);  // I = 128: one n-tile of 256 columns
  const auto& g = L.ranks[0];
  EXPECT_EQ(g.dout_rows.bytes, P * H * 2);
  EXPECT_EQ(g.x_rows.bytes, P * H * 2);
  EXPECT_EQ(g.w_rows.bytes, P * 4);
  EXPECT_EQ(g.d13_rows.bytes, P * 2 * I * 2);
  EXPECT_EQ(g.hw_rows.bytes, P * I * 2);
  EXPECT_EQ(g.dw_parts.bytes, T * k * 1 * 4);
  EXPECT_EQ(g.dx_rows.bytes, P * H * 2);
  EXPECT_EQ(g.dx_row_of.bytes, T * k * 8);
  EXPECT_EQ(g.shared_d13.bytes, 128 * 2 * S * 2);  // tokens rounded up to one tile
  EXPECT_EQ(g.shared_h.bytes, 128 * S * 2);
  EXPECT_EQ(g.shared_dx.bytes, T * H * 2);
  for (const auto& set : g.counters) EXPECT_EQ(set.bytes, (mok::protocol::counter_words(g.geometry) + 1) * 4);
  // Both sets and the barrier words in one region, zeroed at creation.
  const mok::world::Region zeroed = mok::world::zeroed_at_creation(g);
  EXPECT_EQ(zeroed.offset, g.counters[0].offset);
  EXPECT_EQ(zeroed.end(), g.barrier.end());
  EXPECT_LE(g.counters[0].end(), g.counters[1].offset);
  EXPECT_LE(g.counters[1].end(), g.barrier.offset);
  // Two per kind (its operands) and the outputs stored by TMA boxes.
  EXPECT_EQ(g.maps.bytes, (2 * static_cast<size_t>(mok::protocol::BackwardPass::kNumKinds) + mok::protocol::kBoxStoredOutputs) * kernel.tensor_map_bytes);
  // Without a shared expert its regions are empty.
  const auto plain = mok::make_config(mok::find_shape("tiny"), std::vector<int>{64});
  const auto Lp = mok::world::backward_layout(
      plain, mok::world::backward_options(plain, {}, resolved(128, 66, 2), kernel), kernel);
  if (plain.shared_width() == 0) {
    EXPECT_EQ(Lp.ranks[0].shared_d13.bytes, 0u);
    EXPECT_EQ(Lp.ranks[0].shared_h.bytes, 0u);
  }
}

// Recompute mode keeps its own [gate | up] (the forward kept none): one
// more region per rank for the routed rows and one for the shared expert's,
// the recompute table's counters and maps; save mode has neither region.
TEST(BackwardLayout, RecomputeModeAddsTheKeptPreactivationsAndItsTablesCounters) {
  const auto config = mok::make_config(mok::find_shape("small"), std::vector<int>{100, 37});
  const KernelFacts kernel = hopper_kernel();
  const auto o = mok::world::backward_options(config, {}, resolved(256, 66, 3), kernel);
  const auto save = mok::world::backward_layout(config, o, kernel, mok::BackwardMode::kSave);
  const auto re = mok::world::backward_layout(config, o, kernel, mok::BackwardMode::kRecompute);
  const size_t I = 128, S = 128, P = static_cast<size_t>(re.buffer_rows);
  ASSERT_EQ(re.buffer_rows, save.buffer_rows);
  for (size_t r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto& g = re.ranks[r];
    EXPECT_EQ(save.ranks[r].kept_preact.bytes, 0u);
    EXPECT_EQ(save.ranks[r].kept_shared_preact.bytes, 0u);
    EXPECT_EQ(g.kept_preact.bytes, P * 2 * I * 2);
    EXPECT_EQ(g.kept_shared_preact.bytes, 128 * 2 * S * 2);  // tokens rounded up to one tile
    EXPECT_EQ(g.counters[0].bytes, (mok::protocol::counter_words(g.recompute_geometry) + 1) * 4);
    EXPECT_GT(g.counters[0].bytes, save.ranks[r].counters[0].bytes);  // two more counters
    EXPECT_EQ(g.maps.bytes,
              (2 * static_cast<size_t>(mok::protocol::BackwardRecomputePass::kNumKinds) + mok::protocol::kBoxStoredOutputs) * kernel.tensor_map_bytes);
    // The regions do not overlap and fit the rank's bytes.
    size_t end = 0;
    for (const auto& region : mok::world::regions(g)) {
      EXPECT_GE(region.region.offset, end) << region.name;
      end = region.region.offset + region.region.bytes;
    }
    EXPECT_LE(end, g.bytes);
  }
  EXPECT_GT(re.bytes, save.bytes);
}

// A process world's rank stages what its peers read (its x, dout, routing
// weights and the end of its schedule's expert offsets); the other worlds
// read the caller's tensors and stage nothing. Its handles carry a
// fingerprint of their own: neither a forward's nor another mode's.
TEST(BackwardLayout, AProcessWorldStagesWhatItsPeersRead) {
  const auto config = mok::make_config(mok::find_shape("small"), std::vector<int>{100, 37});
  const KernelFacts kernel = hopper_kernel();
  const auto o = mok::world::backward_options(config, {}, resolved(256, 66, 3), kernel);
  const auto plain = mok::world::backward_layout(config, o, kernel, mok::BackwardMode::kSave);
  const auto staged = mok::world::backward_layout(config, o, kernel, mok::BackwardMode::kSave, true);
  const size_t H = static_cast<size_t>(config.hidden), k = static_cast<size_t>(config.top_k);
  for (size_t r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const size_t T = static_cast<size_t>(config.tokens_per_rank[r]);
    const auto& g = staged.ranks[r];
    EXPECT_EQ(g.staged_x.bytes, T * H * 2);
    EXPECT_EQ(g.staged_dout.bytes, T * H * 2);
    EXPECT_EQ(g.staged_weights.bytes, T * k * 4);
    EXPECT_EQ(g.staged_expert_offset.bytes, (static_cast<size_t>(config.experts_per_rank()) + 1) * 4);
    for (const auto* region : {&plain.ranks[r].staged_x, &plain.ranks[r].staged_dout, &plain.ranks[r].staged_weights,
                               &plain.ranks[r].staged_expert_offset}) {
      EXPECT_EQ(region->bytes, 0u);
    }
    size_t end = 0;
    for (const auto& region : mok::world::regions(g)) {
      EXPECT_GE(region.region.offset, end) << region.name;
      end = region.region.offset + region.region.bytes;
    }
    EXPECT_LE(end, g.bytes);
  }
  const uint64_t save = mok::world::backward_fingerprint(config, o, kernel, mok::BackwardMode::kSave);
  EXPECT_NE(save, mok::world::backward_fingerprint(config, o, kernel, mok::BackwardMode::kRecompute));
  EXPECT_NE(save, mok::world::layout_fingerprint(config, o, kernel));
}

TEST(BackwardLayout, RefusesASchedulePastTheBuffersBound) {
  // 2^30 buffer rows at most: a world whose schedule capacity passes it.
  auto config = mok::make_config(mok::find_shape("tiny"), std::vector<int>{1 << 24, 1 << 24});
  config.top_k = 64;
  const KernelFacts kernel = hopper_kernel();
  try {
    mok::world::backward_options(config, {}, resolved(2048, 66, 2), kernel);
    ADD_FAILURE() << "a schedule of 2^31 rows was accepted";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("2^30 rows"), std::string::npos) << e.what();
  }
}

}  // namespace
