// The reference's backward against central finite differences of its own
// kFP64 forward, for every gradient, with loss = sum(out * G) and G = dout.
//
// The inputs are bf16 values of magnitude >= 2^-6 times their scale, so
// adding the power-of-two steps 2^-8 and 2^-9 to a float input is exact: the
// difference quotient sees exactly the perturbation it divides by. Richardson
// extrapolation of the two steps cancels the h^2 error term, which leaves
// fp64 rounding (~1e-11 here) as the only error, far below the tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mok/synthetic.hpp"
#include "mok/reference.hpp"
#include "mok/schedule.hpp"

namespace mok {
namespace {

constexpr int kChecksPerGradient = 24;

LayerConfig gradient_config() {
  LayerConfig config;
  config.hidden = 64;
  config.intermediate = 64;
  config.num_experts = 4;
  config.top_k = 2;
  config.num_shared_experts = 1;
  config.shared_intermediate = 128;
  config.world_size = 4;
  config.tokens_per_rank = {2, 0, 1, 2};  // a rank without tokens, one with a single token
  return config;
}

ReferenceOptions options(RefPrecision precision) {
  ReferenceOptions o;
  o.precision = precision;
  o.num_threads = 2;
  return o;
}

double max_abs(const std::vector<double>& values) {
  double m = 0.0;
  for (double v : values) m = std::max(m, std::abs(v));
  return m;
}

std::vector<double> concat(const std::vector<std::vector<double>>& per_rank) {
  std::vector<double> all;
  for (const std::vector<double>& rank : per_rank) all.insert(all.end(), rank.begin(), rank.end());
  return all;
}

class ReferenceGradients : public ::testing::Test {
 protected:
  ReferenceGradients()
      : layer_(synthetic::make_layer(gradient_config(), 31)),
        routing_(layer_.routing()),
        schedule_(build_schedule(layer_.config, routing_)),
        dout_(synthetic::random_dout(layer_.config, 32)),
        dout_ptrs_(synthetic::rank_pointers(dout_)) {
    const LayerInputs in = layer_.inputs();
    grad_ = reference_backward(in, schedule_, dout_ptrs_, options(RefPrecision::kFP64));
  }

  // sum(out * G) of the kFP64 forward on the current (possibly perturbed) data.
  double loss() {
    const ReferenceForward f = reference_forward(layer_.inputs(), schedule_, options(RefPrecision::kFP64));
    double sum = 0.0;
    for (size_t r = 0; r < f.out.size(); ++r) {
      for (size_t i = 0; i < f.out[r].size(); ++i) sum += f.out[r][i] * dout_[r][i];
    }
    return sum;
  }

  // d loss / d *value by central differences with steps 2^-8 and 2^-9,
  // Richardson-extrapolated: (4 D(h/2) - D(h)) / 3.
  double finite_difference(float* value) {
    const float saved = *value;
    auto quotient = [&](float h) {
      // The perturbed inputs must be exact, or the quotient divides by the wrong step.
      EXPECT_EQ((saved + h) - saved, h);
      EXPECT_EQ(saved - (saved - h), h);
      *value = saved + h;
      const double up = loss();
      *value = saved - h;
      const double down = loss();
      *value = saved;
      return (up - down) / (2.0 * h);
    };
    const double coarse = quotient(0x1.0p-8f);
    const double fine = quotient(0x1.0p-9f);
    return (4.0 * fine - coarse) / 3.0;
  }

  // Compares `analytic` with finite differences at kChecksPerGradient random
  // entries (all of them when there are fewer), entry i being *input(i).
  template <typename Input>
  void check(const std::string& name, const std::vector<double>& analytic, Input input,
             uint64_t seed) {
    ASSERT_GT(analytic.size(), 0u) << name;
    const double scale = max_abs(analytic);
    ASSERT_GT(scale, 0.0) << name << " is all zero: the check would prove nothing";
    synthetic::Rng rng(seed, 0);
    const size_t checks = std::min<size_t>(kChecksPerGradient, analytic.size());
    for (size_t n = 0; n < checks; ++n) {
      const size_t i = checks == analytic.size() ? n : static_cast<size_t>(rng.below(static_cast<int>(analytic.size())));
      const double fd = finite_difference(input(i));
      EXPECT_NEAR(analytic[i], fd, 1e-8 * scale + 1e-6 * std::abs(fd))
          << name << "[" << i << "] (largest |entry| " << scale << ")";
    }
  }

  // Entry i of per-rank data laid end to end in global token order.
  static float* global_entry(std::vector<std::vector<float>>& per_rank, size_t i) {
    for (std::vector<float>& rank : per_rank) {
      if (i < rank.size()) return &rank[i];
      i -= rank.size();
    }
    return nullptr;
  }

  synthetic::Layer layer_;
  std::vector<RankRouting> routing_;
  WorldSchedule schedule_;
  std::vector<std::vector<float>> dout_;
  std::vector<const float*> dout_ptrs_;
  ReferenceBackward grad_;
};

TEST_F(ReferenceGradients, DxMatchesFiniteDifferences) {
  check("dx", concat(grad_.dx), [&](size_t i) { return global_entry(layer_.x, i); }, 1);
}

TEST_F(ReferenceGradients, DWeightsMatchFiniteDifferences) {
  check("dweights", concat(grad_.dweights), [&](size_t i) { return global_entry(layer_.weights, i); }, 2);
}

TEST_F(ReferenceGradients, DW13MatchesFiniteDifferences) {
  check("dw13", grad_.dw13, [&](size_t i) { return &layer_.w13[i]; }, 3);
}

TEST_F(ReferenceGradients, DW2MatchesFiniteDifferences) {
  check("dw2", grad_.dw2, [&](size_t i) { return &layer_.w2[i]; }, 4);
}

TEST_F(ReferenceGradients, DSharedW13MatchesFiniteDifferences) {
  check("dshared_w13", grad_.dshared_w13, [&](size_t i) { return &layer_.shared_w13[i]; }, 5);
}

TEST_F(ReferenceGradients, DSharedW2MatchesFiniteDifferences) {
  check("dshared_w2", grad_.dshared_w2, [&](size_t i) { return &layer_.shared_w2[i]; }, 6);
}

// The kFP32 backward (from bf16-rounded activations, fp32 sums) against the
// exact gradients. dx and the W13 gradients never see a rounded value (they
// flow from dout through W2 and the unrounded g, u), so they differ only by
// fp32 summation error (measured ~3e-7 of the largest entry). d weights and
// the W2 gradients use the bf16 y and h, so they differ by about one bf16
// rounding (2^-9; measured ~2e-3 of the largest entry).
TEST_F(ReferenceGradients, FP32BackwardCloseToFP64) {
  const ReferenceBackward g32 =
      reference_backward(layer_.inputs(), schedule_, dout_ptrs_, options(RefPrecision::kFP32));
  auto expect_close = [](const std::string& name, const std::vector<double>& a,
                         const std::vector<double>& b, double relative) {
    ASSERT_EQ(a.size(), b.size()) << name;
    const double scale = max_abs(b);
    double worst = 0.0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
    EXPECT_LE(worst, relative * scale) << name << ": largest |fp32 - fp64| vs largest |fp64|";
  };
  constexpr double kFp32Sums = 0x1.0p-16;
  constexpr double kBf16Rounding = 0x1.0p-7;
  expect_close("dx", concat(g32.dx), concat(grad_.dx), kFp32Sums);
  expect_close("dw13", g32.dw13, grad_.dw13, kFp32Sums);
  expect_close("dshared_w13", g32.dshared_w13, grad_.dshared_w13, kFp32Sums);
  expect_close("dweights", concat(g32.dweights), concat(grad_.dweights), kBf16Rounding);
  expect_close("dw2", g32.dw2, grad_.dw2, kBf16Rounding);
  expect_close("dshared_w2", g32.dshared_w2, grad_.dshared_w2, kBf16Rounding);
}

}  // namespace
}  // namespace mok
