// The CPU reference of one MoE layer: hand-computed cases, its rounding
// policy, and the determinism it promises (thread count, EP degree, tile
// height never change a bit). Gradients are checked in test_reference_gradients.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "mok/synthetic.hpp"
#include "mok/bf16.hpp"
#include "mok/error.hpp"
#include "mok/reference.hpp"
#include "mok/schedule.hpp"

namespace mok {
namespace {

using synthetic::make_layer;
using synthetic::Layer;
using synthetic::RoutingMode;

constexpr int kH = 64;

// A small legal layer: H = 64, I = 64, shared width 128 (differs from I, so
// the two widths cannot be confused), E experts, top-k.
LayerConfig small_config(std::vector<int> tokens, int experts = 8, int top_k = 3,
                         int shared_experts = 1) {
  LayerConfig config;
  config.hidden = kH;
  config.intermediate = 64;
  config.num_experts = experts;
  config.top_k = top_k;
  config.num_shared_experts = shared_experts;
  config.shared_intermediate = 128;
  config.world_size = static_cast<int>(tokens.size());
  config.tokens_per_rank = std::move(tokens);
  return config;
}

ReferenceOptions options(RefPrecision precision, int threads = 1) {
  ReferenceOptions o;
  o.precision = precision;
  o.num_threads = threads;
  return o;
}

::testing::AssertionResult same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0) {
      return ::testing::AssertionFailure()
             << "first difference at " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Ranks' vectors laid end to end: global token order.
std::vector<double> concat(const std::vector<std::vector<double>>& per_rank) {
  std::vector<double> all;
  for (const std::vector<double>& rank : per_rank) all.insert(all.end(), rank.begin(), rank.end());
  return all;
}

void expect_same_forward(const ReferenceForward& a, const ReferenceForward& b) {
  EXPECT_TRUE(same_bits(concat(a.out), concat(b.out))) << "out";
  EXPECT_TRUE(same_bits(concat(a.expert_out), concat(b.expert_out))) << "expert_out";
  EXPECT_TRUE(same_bits(concat(a.shared_out), concat(b.shared_out))) << "shared_out";
}

void expect_same_backward(const ReferenceBackward& a, const ReferenceBackward& b) {
  EXPECT_TRUE(same_bits(concat(a.dx), concat(b.dx))) << "dx";
  EXPECT_TRUE(same_bits(concat(a.dweights), concat(b.dweights))) << "dweights";
  EXPECT_TRUE(same_bits(a.dw13, b.dw13)) << "dw13";
  EXPECT_TRUE(same_bits(a.dw2, b.dw2)) << "dw2";
  EXPECT_TRUE(same_bits(a.dshared_w13, b.dshared_w13)) << "dshared_w13";
  EXPECT_TRUE(same_bits(a.dshared_w2, b.dshared_w2)) << "dshared_w2";
}

// Forward and backward of a random layer with a random dout.
struct LayerRun {
  ReferenceForward fwd;
  ReferenceBackward bwd;
};

LayerRun run_layer(const Layer& layer, const ReferenceOptions& opts, int tile_rows = 128) {
  const std::vector<RankRouting> routing = layer.routing();
  ScheduleOptions schedule_options;
  schedule_options.tile_rows = tile_rows;
  const WorldSchedule schedule = build_schedule(layer.config, routing, schedule_options);
  const std::vector<std::vector<float>> dout = synthetic::random_dout(layer.config, 99);
  const std::vector<const float*> dout_ptrs = synthetic::rank_pointers(dout);
  const LayerInputs inputs = layer.inputs();
  return {reference_forward(inputs, schedule, opts), reference_backward(inputs, schedule, dout_ptrs, opts)};
}

// ---------------------------------------------------------------------------
// Hand-computed layer: R = 1, E = 2, k = 2, two tokens, shared width 64. All
// weights are zero but a few ones and twos, so every output is a short formula:
//   expert 0: g_0 = x_0, u_0 = x_1, y_0 = h_0, y_3 = 2 h_0
//   expert 1: g_2 = 2 x_0, u_2 = x_0, y_1 = h_2
//   shared:   g_0 = x_5, u_0 = x_0, s_7 = h_0
//   token 0: x_0 = 1, x_1 = 2;    experts (1, 0), weights (0.5, 0.25)
//   token 1: x_0 = -1, x_5 = 0.5; experts (0, 1), weights (2, -1)
class HandLayer : public ::testing::Test {
 protected:
  static constexpr int kI = 64;
  static constexpr int kS = 64;

  HandLayer() {
    config_.hidden = kH;
    config_.intermediate = kI;
    config_.num_experts = 2;
    config_.top_k = 2;
    config_.num_shared_experts = 1;
    config_.world_size = 1;
    config_.tokens_per_rank = {2};
    x_.assign(2 * kH, 0.0f);
    x_[0] = 1.0f;
    x_[1] = 2.0f;
    x_[kH + 0] = -1.0f;
    x_[kH + 5] = 0.5f;
    w13_.assign(2 * 2 * kI * kH, 0.0f);
    w2_.assign(2 * kH * kI, 0.0f);
    shared_w13_.assign(2 * kS * kH, 0.0f);
    shared_w2_.assign(kH * kS, 0.0f);
    w13_at(0, 0, 0) = 1.0f;       // expert 0 gate row 0 <- x_0
    w13_at(0, kI + 0, 1) = 1.0f;  // expert 0 up row 0 <- x_1
    w2_at(0, 0, 0) = 1.0f;        // expert 0 y_0 <- h_0
    w2_at(0, 3, 0) = 2.0f;        // expert 0 y_3 <- 2 h_0
    w13_at(1, 2, 0) = 2.0f;       // expert 1 gate row 2 <- 2 x_0
    w13_at(1, kI + 2, 0) = 1.0f;  // expert 1 up row 2 <- x_0
    w2_at(1, 1, 2) = 1.0f;        // expert 1 y_1 <- h_2
    shared_w13_[0 * kH + 5] = 1.0f;         // shared gate row 0 <- x_5
    shared_w13_[(kS + 0) * kH + 0] = 1.0f;  // shared up row 0 <- x_0
    shared_w2_[7 * kS + 0] = 1.0f;          // shared s_7 <- h_0
  }

  float& w13_at(int e, int row, int col) { return w13_[(e * 2 * kI + row) * kH + col]; }
  float& w2_at(int e, int row, int col) { return w2_[(e * kH + row) * kI + col]; }

  LayerInputs inputs() const {
    LayerInputs in;
    in.config = config_;
    in.x = {x_.data()};
    in.routing = {RankRouting{ids_.data(), weights_.data(), 2}};
    in.w13 = w13_.data();
    in.w2 = w2_.data();
    in.shared_w13 = shared_w13_.data();
    in.shared_w2 = shared_w2_.data();
    return in;
  }

  ReferenceForward forward(RefPrecision precision) const {
    const LayerInputs in = inputs();
    return reference_forward(in, build_schedule(config_, in.routing), options(precision));
  }

  static double silu64(double g) { return g / (1.0 + std::exp(-g)); }
  static float silu32(float g) { return g / (1.0f + std::exp(-g)); }

  LayerConfig config_;
  std::vector<float> x_, w13_, w2_, shared_w13_, shared_w2_;
  std::vector<int32_t> ids_ = {1, 0, 0, 1};
  std::vector<float> weights_ = {0.5f, 0.25f, 2.0f, -1.0f};
};

TEST_F(HandLayer, ForwardFP64IsTheFormula) {
  const ReferenceForward f = forward(RefPrecision::kFP64);
  std::vector<double> out(2 * kH, 0.0), expert(2 * 2 * kH, 0.0), shared(2 * kH, 0.0);
  // Token 0: expert 1 (w 0.5) gives y_1 = silu(2); expert 0 (w 0.25) gives
  // y_0 = 2 silu(1), y_3 = 4 silu(1); the shared gate sees x_5 = 0, so s = 0.
  expert[0 * kH + 1] = silu64(2.0);
  expert[1 * kH + 0] = 2 * silu64(1.0);
  expert[1 * kH + 3] = 4 * silu64(1.0);
  out[0] = 0.5 * silu64(1.0);
  out[1] = 0.5 * silu64(2.0);
  out[3] = silu64(1.0);
  // Token 1: expert 0 sees u_0 = x_1 = 0, so y = 0; expert 1 (w -1) gives
  // y_1 = -silu(-2); shared: h_0 = silu(0.5) * -1 lands in s_7.
  expert[3 * kH + 1] = -silu64(-2.0);
  shared[kH + 7] = -silu64(0.5);
  out[kH + 1] = silu64(-2.0);
  out[kH + 7] = -silu64(0.5);
  for (int i = 0; i < 2 * kH; ++i) {
    EXPECT_DOUBLE_EQ(f.out[0][i], out[i]) << "out " << i;
    EXPECT_DOUBLE_EQ(f.shared_out[0][i], shared[i]) << "shared_out " << i;
  }
  for (int i = 0; i < 4 * kH; ++i) EXPECT_DOUBLE_EQ(f.expert_out[0][i], expert[i]) << "expert_out " << i;
}

TEST_F(HandLayer, ForwardFP32RoundsHAndYAndOutToBF16) {
  const ReferenceForward f = forward(RefPrecision::kFP32);
  // h is rounded to bf16 right after SwiGLU; y and out are then exact here
  // (scaling by 2, 0.5, 0.25 or -1 keeps a bf16 value bf16).
  const float h0 = round_to_bf16(silu32(1.0f) * 2.0f);
  const float h2 = round_to_bf16(silu32(2.0f) * 1.0f);
  const float h2_t1 = round_to_bf16(silu32(-2.0f) * -1.0f);
  const float hs_t1 = round_to_bf16(silu32(0.5f) * -1.0f);
  ASSERT_NE(h0, silu32(1.0f) * 2.0f) << "the case should exercise rounding";
  std::vector<double> out(2 * kH, 0.0);
  out[0] = 0.25f * h0;
  out[1] = 0.5f * h2;
  out[3] = 0.5f * h0;
  out[kH + 1] = -h2_t1;
  out[kH + 7] = hs_t1;
  for (int i = 0; i < 2 * kH; ++i) EXPECT_EQ(f.out[0][i], out[i]) << "out " << i;
  EXPECT_EQ(f.expert_out[0][1 * kH + 3], 2.0f * h0);
  EXPECT_EQ(f.expert_out[0][3 * kH + 1], h2_t1);
  EXPECT_EQ(f.shared_out[0][kH + 7], hs_t1);
}

TEST_F(HandLayer, BackwardWeightGradientsByHand) {
  const LayerInputs in = inputs();
  const WorldSchedule schedule = build_schedule(config_, in.routing);
  const std::vector<float> ones(2 * kH, 1.0f);
  const std::vector<const float*> dout = {ones.data()};
  const ReferenceBackward b =
      reference_backward(in, schedule, dout, options(RefPrecision::kFP64));
  // With dout = 1 everywhere, d weight[t][j] = sum of that slot's y.
  EXPECT_DOUBLE_EQ(b.dweights[0][0], silu64(2.0));
  EXPECT_DOUBLE_EQ(b.dweights[0][1], 6 * silu64(1.0));
  EXPECT_DOUBLE_EQ(b.dweights[0][2], 0.0);
  EXPECT_DOUBLE_EQ(b.dweights[0][3], -silu64(-2.0));
  // dW_down[1][n][i] = sum over expert 1's rows of (w * 1) * h_i: only i = 2
  // is non-zero, from token 0 (w 0.5, h_2 = silu(2)) and token 1 (w -1,
  // h_2 = -silu(-2)).
  for (int n = 0; n < kH; ++n) {
    for (int i = 0; i < kI; ++i) {
      const double expected = i == 2 ? 0.5 * silu64(2.0) + silu64(-2.0) : 0.0;
      EXPECT_DOUBLE_EQ(b.dw2[(kH + n) * kI + i], expected) << "n " << n << " i " << i;
    }
  }
}

// ---------------------------------------------------------------------------

TEST(Reference, OutIsSharedPlusSlotsInOrderInFP32) {
  for (const int shared_experts : {0, 1}) {
    SCOPED_TRACE(shared_experts);
    const Layer layer =
        make_layer(small_config({5, 3}, 8, 3, shared_experts), 11);
    const LayerRun run = run_layer(layer, options(RefPrecision::kFP32));
    const int k = layer.config.top_k;
    for (int r = 0; r < 2; ++r) {
      for (int t = 0; t < layer.config.tokens_per_rank[r]; ++t) {
        for (int c = 0; c < kH; ++c) {
          const float s = static_cast<float>(run.fwd.shared_out[r][t * kH + c]);
          if (shared_experts == 0) {
            EXPECT_EQ(s, 0.0f);
          }
          float acc = s;
          for (int j = 0; j < k; ++j) {
            const float y = static_cast<float>(run.fwd.expert_out[r][(t * k + j) * kH + c]);
            EXPECT_EQ(y, round_to_bf16(y)) << "y must be stored as bf16";
            acc = std::fma(layer.weights[r][t * k + j], y, acc);
          }
          EXPECT_EQ(run.fwd.out[r][t * kH + c], round_to_bf16(acc)) << r << " " << t << " " << c;
        }
      }
    }
  }
}

TEST(Reference, FP32ForwardCloseToFP64) {
  const Layer layer = make_layer(small_config({7, 6}), 5);
  const LayerInputs in = layer.inputs();
  const WorldSchedule schedule = build_schedule(layer.config, in.routing);
  const ReferenceForward f32 = reference_forward(in, schedule, options(RefPrecision::kFP32));
  const ReferenceForward f64 = reference_forward(in, schedule, options(RefPrecision::kFP64));
  const std::vector<double> a = concat(f32.out), b = concat(f64.out);
  double scale = 0.0;
  for (double v : b) scale = std::max(scale, std::abs(v));
  ASSERT_GT(scale, 0.0);
  // bf16 keeps 8 significant bits (relative rounding error 2^-9). h, y and out
  // are each rounded once, and y sums I rounded h terms, so allow a few
  // roundings of the value itself plus a small share of the largest output.
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], 3 * 0x1.0p-9 * std::abs(b[i]) + 0x1.0p-9 * scale) << i;
  }
}

TEST(Reference, ThreadCountNeverChangesABit) {
  // 150 tokens all on experts 0..2: 150 rows per expert, more than one chunk
  // of the backward's row loop.
  const Layer layer =
      make_layer(small_config({100, 50}, 8, 3), 21, RoutingMode::kSameExperts);
  for (const RefPrecision precision : {RefPrecision::kFP32, RefPrecision::kFP64}) {
    const LayerRun base = run_layer(layer, options(precision, 1));
    for (const int threads : {2, 3, 8}) {
      SCOPED_TRACE(threads);
      const LayerRun run = run_layer(layer, options(precision, threads));
      expect_same_forward(base.fwd, run.fwd);
      expect_same_backward(base.bwd, run.bwd);
    }
  }
}

// The same global batch split over R = 1, 2, 4 ranks (unevenly, with ranks of
// 0 and 1 tokens), and scheduled with different tile heights, gives the same
// bits for every token and every weight gradient: rows are reduced in global
// token order whatever the EP degree.
TEST(Reference, EveryWorldSizeAndTileHeightGivesTheSameBits) {
  const std::vector<std::vector<int>> splits = {{13}, {0, 13}, {6, 7}, {1, 0, 7, 5}, {0, 1, 12, 0}};
  for (const RoutingMode mode : {RoutingMode::kUniform, RoutingMode::kSkewed}) {
    for (const RefPrecision precision : {RefPrecision::kFP32, RefPrecision::kFP64}) {
      const LayerRun base = run_layer(make_layer(small_config(splits[0]), 3, mode),
                                 options(precision));
      for (const std::vector<int>& split : splits) {
        for (const int tile_rows : {1, 5, 128}) {
          SCOPED_TRACE(testing::Message() << "R " << split.size() << " tile " << tile_rows);
          const Layer layer = make_layer(small_config(split), 3, mode);
          const LayerRun run = run_layer(layer, options(precision, 2), tile_rows);
          expect_same_forward(base.fwd, run.fwd);
          expect_same_backward(base.bwd, run.bwd);
        }
      }
    }
  }
}

TEST(Reference, ExtremeImbalanceLeavesIdleExpertsWithZeroGradients) {
  const Layer layer =
      make_layer(small_config({5, 0, 1, 9}, 8, 3), 8, RoutingMode::kSameExperts);
  const LayerRun run = run_layer(layer, options(RefPrecision::kFP32, 2));
  const int64_t per_expert13 = 2 * 64 * kH;
  for (int e = 0; e < 8; ++e) {
    double norm = 0.0;
    for (int64_t i = 0; i < per_expert13; ++i) norm += std::abs(run.bwd.dw13[e * per_expert13 + i]);
    if (e < 3) {
      EXPECT_GT(norm, 0.0) << "expert " << e << " has all the rows";
    } else {
      EXPECT_EQ(norm, 0.0) << "expert " << e << " has no rows";
    }
  }
  for (double v : concat(run.fwd.out)) ASSERT_TRUE(std::isfinite(v));
  for (double v : concat(run.bwd.dx)) ASSERT_TRUE(std::isfinite(v));
}

TEST(Reference, ScheduleCombineRowNamesTheRowThatHoldsEachEntry) {
  const Layer layer = make_layer(small_config({4, 0, 6, 3}), 17, RoutingMode::kSkewed);
  const std::vector<RankRouting> routing = layer.routing();
  const WorldSchedule schedule = build_schedule(layer.config, routing);
  const int k = layer.config.top_k;
  for (int r = 0; r < 4; ++r) {
    for (int t = 0; t < layer.config.tokens_per_rank[r]; ++t) {
      for (int j = 0; j < k; ++j) {
        const int expert = layer.expert_ids[r][t * k + j];
        const RankSchedule& owner = schedule.ranks[layer.config.expert_owner(expert)];
        const RowSource& row = owner.rows[schedule.combine_row[r][t * k + j]];
        EXPECT_EQ(row.rank, r);
        EXPECT_EQ(row.token, t);
        EXPECT_EQ(row.slot, j);
      }
    }
  }
}

// ---------------------------------------------------------------------------

class ReferenceRejects : public ::testing::Test {
 protected:
  ReferenceRejects()
      : layer_(make_layer(small_config({3, 0}), 1)),
        routing_(layer_.routing()),
        schedule_(build_schedule(layer_.config, routing_)),
        dout_(synthetic::random_dout(layer_.config, 2)),
        dout_ptrs_(synthetic::rank_pointers(dout_)) {}

  void expect_rejected(const LayerInputs& in, const WorldSchedule& schedule) {
    EXPECT_THROW(reference_forward(in, schedule), Error);
    EXPECT_THROW(reference_backward(in, schedule, dout_ptrs_), Error);
  }

  Layer layer_;
  std::vector<RankRouting> routing_;
  WorldSchedule schedule_;
  std::vector<std::vector<float>> dout_;
  std::vector<const float*> dout_ptrs_;
};

TEST_F(ReferenceRejects, MissingPointers) {
  LayerInputs in = layer_.inputs();
  in.x[1] = nullptr;  // rank 1 has no tokens: allowed
  EXPECT_NO_THROW(reference_forward(in, schedule_));
  in.x[0] = nullptr;
  expect_rejected(in, schedule_);
  in = layer_.inputs();
  in.w13 = nullptr;
  expect_rejected(in, schedule_);
  in = layer_.inputs();
  in.w2 = nullptr;
  expect_rejected(in, schedule_);
  in = layer_.inputs();
  in.shared_w2 = nullptr;
  expect_rejected(in, schedule_);
  in = layer_.inputs();
  in.routing[0].weights = nullptr;
  expect_rejected(in, schedule_);
  in = layer_.inputs();
  in.x.pop_back();
  expect_rejected(in, schedule_);

  in = layer_.inputs();
  std::vector<const float*> dout = dout_ptrs_;
  dout[0] = nullptr;
  EXPECT_THROW(reference_backward(in, schedule_, dout), Error);
  dout.pop_back();
  EXPECT_THROW(reference_backward(in, schedule_, dout), Error);
  EXPECT_THROW(reference_forward(in, schedule_, options(RefPrecision::kFP32, 0)), Error);
}

TEST_F(ReferenceRejects, ScheduleOfAnotherShapeOrRouting) {
  const LayerInputs in = layer_.inputs();
  WorldSchedule schedule = schedule_;
  schedule.top_k = 2;
  expect_rejected(in, schedule);
  schedule = schedule_;
  schedule.ranks.pop_back();
  expect_rejected(in, schedule);
  schedule = schedule_;
  schedule.combine_row[0].pop_back();
  expect_rejected(in, schedule);
  // Built for other routing with the same shape.
  const Layer other = make_layer(layer_.config, 2);
  const std::vector<RankRouting> other_routing = other.routing();
  expect_rejected(in, build_schedule(layer_.config, other_routing));
}

TEST_F(ReferenceRejects, TamperedRowsOrCombineMap) {
  const LayerInputs in = layer_.inputs();
  // Two real rows of one expert swapped: each still routed there, but
  // combine_row no longer points back.
  WorldSchedule schedule = schedule_;
  RankSchedule* rs = nullptr;
  int expert = -1;
  for (RankSchedule& candidate : schedule.ranks) {
    for (int e = 0; e < candidate.num_local_experts && expert < 0; ++e) {
      if (candidate.expert_rows[e] >= 2) {
        rs = &candidate;
        expert = e;
      }
    }
  }
  ASSERT_NE(rs, nullptr) << "3 tokens, k 3, 8 experts: some expert should have 2 rows";
  std::swap(rs->rows[rs->expert_offset[expert]], rs->rows[rs->expert_offset[expert] + 1]);
  expect_rejected(in, schedule);
  // A real row turned into padding (row 0 of a rank with rows is real:
  // padding only ends a non-empty expert block).
  schedule = schedule_;
  for (RankSchedule& candidate : schedule.ranks) {
    if (!candidate.rows.empty()) {
      candidate.rows[0] = padding_row();
      break;
    }
  }
  expect_rejected(in, schedule);
}

// ---------------------------------------------------------------------------

TEST(Layer, DeterministicValidAndBF16Exact) {
  for (const RoutingMode mode : {RoutingMode::kUniform, RoutingMode::kSkewed, RoutingMode::kSameExperts}) {
    const LayerConfig config = small_config({40, 0, 1, 23}, 8, 3);
    const Layer a = make_layer(config, 7, mode);
    const Layer b = make_layer(config, 7, mode);
    EXPECT_EQ(a.x, b.x);
    EXPECT_EQ(a.expert_ids, b.expert_ids);
    EXPECT_EQ(a.w13, b.w13);
    EXPECT_NE(make_layer(config, 8, mode).w13, a.w13);
    const std::vector<RankRouting> routing = a.routing();
    EXPECT_NO_THROW(validate_routing(config, routing, true));
    for (const std::vector<float>* v : {&a.w13, &a.w2, &a.shared_w13, &a.shared_w2, &a.x[0], &a.weights[3]}) {
      ASSERT_FALSE(v->empty());
      for (float f : *v) {
        ASSERT_NE(f, 0.0f);
        ASSERT_EQ(f, round_to_bf16(f));
      }
    }
  }
}

TEST(Layer, RoutingModesShapeTheLoad) {
  const LayerConfig config = small_config({300, 300}, 16, 2);
  std::vector<std::vector<int>> load(3, std::vector<int>(16, 0));
  const RoutingMode modes[] = {RoutingMode::kUniform, RoutingMode::kSkewed, RoutingMode::kSameExperts};
  for (int m = 0; m < 3; ++m) {
    const Layer layer = make_layer(config, 4, modes[m]);
    for (const std::vector<int32_t>& ids : layer.expert_ids) {
      for (int32_t id : ids) ++load[m][id];
    }
  }
  for (int e = 0; e < 16; ++e) EXPECT_GT(load[0][e], 0) << "uniform reaches every expert";
  EXPECT_GT(load[1][0], 3 * load[1][15]) << "skewed favours low ids";
  EXPECT_EQ(load[2][0], 600);
  EXPECT_EQ(load[2][1], 600);
  EXPECT_EQ(load[2][2], 0);
}

// The data is a function of the global token index, not of the split.
TEST(Layer, SameGlobalBatchForEverySplit) {
  const Layer one = make_layer(small_config({9}), 12);
  const Layer four = make_layer(small_config({2, 0, 6, 1}), 12);
  std::vector<float> x;
  std::vector<int32_t> ids;
  for (int r = 0; r < 4; ++r) {
    x.insert(x.end(), four.x[r].begin(), four.x[r].end());
    ids.insert(ids.end(), four.expert_ids[r].begin(), four.expert_ids[r].end());
  }
  EXPECT_EQ(x, one.x[0]);
  EXPECT_EQ(ids, one.expert_ids[0]);
  EXPECT_EQ(four.w13, one.w13);
}

}  // namespace
}  // namespace mok

// The one comparison of bf16 outputs with a reference (mok_cli, GPU tests).
TEST(RelativeL2Error, ZeroForExactOutputsLargeForUnwrittenOnesAndRefusesAMismatch) {
  const std::vector<std::vector<double>> ref = {{1.0, -2.0}, {}, {0.5}};
  std::vector<uint16_t> out;
  for (const auto& rank : ref) {
    for (double v : rank) out.push_back(mok::float_to_bf16_bits(static_cast<float>(v)));
  }
  EXPECT_EQ(mok::relative_l2_error(out, ref), 0.0);
  out[1] = mok::float_to_bf16_bits(-2.5f);  // off by 0.5 of ||ref|| = 2.29
  EXPECT_NEAR(mok::relative_l2_error(out, ref), 0.5 / std::sqrt(1.0 + 4.0 + 0.25), 1e-12);
  out[2] = 0xFFFF;  // a bf16 NaN: never written
  EXPECT_GT(mok::relative_l2_error(out, ref), 1e10);
  out.pop_back();
  EXPECT_THROW(mok::relative_l2_error(out, ref), mok::Error);
}
