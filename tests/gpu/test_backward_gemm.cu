// The backward's GEMM building blocks against CPU references in double:
//   - the grouped weight-gradient GEMM (fp32 out[g] (+)= sum_r a[r]^T b[r]),
//   - the grouped GEMM's SwiGLU-backward epilogue ([da | db], w * h, d w),
// with outputs poisoned first, non-finite values planted in rows no group
// owns (they must not reach any sum), and the determinism the fused backward
// relies on: bitwise repeatable, and independent of the grid size and of
// where a group sits among the others.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu/gemm_test_support.hpp"
#include "gpu/gpu_test_env.hpp"
#include "mok/bf16.hpp"
#include "mok/error.hpp"
#include "mok/grouped_gemm.hpp"
#include "mok/weight_grad.hpp"

namespace {

using mok::gemm_test::DeviceBuffer;
using mok::gemm_test::Layout;
using mok::gemm_test::random_bf16;

float bf(uint16_t v) { return mok::bf16_bits_to_float(v); }

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Rows no group owns get Inf and NaN: a sum that reads one is visibly wrong.
void plant_non_finite(const Layout& layout, std::vector<uint16_t>& rows, int64_t width) {
  const std::vector<int> owner = layout.owner();
  for (size_t r = 0; r < owner.size(); ++r) {
    if (owner[r] >= 0) continue;
    for (int64_t c = 0; c < width; ++c) rows[r * width + c] = (c % 2) ? 0x7F80 : 0x7FC0;  // +Inf, NaN
  }
}

// ---------------------------------------------------------------- weight grad

struct WeightGradProblem {
  Layout layout;
  int64_t m = 0, n = 0;
  std::vector<uint16_t> a, b;  // [m_total, m], [m_total, n]
};

WeightGradProblem make_weight_grad(const Layout& layout, int64_t m, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  WeightGradProblem p{layout, m, n, random_bf16(layout.m_total * m, rng), random_bf16(layout.m_total * n, rng)};
  plant_non_finite(layout, p.a, m);
  plant_non_finite(layout, p.b, n);
  return p;
}

// out is uploaded first (poison, or the values to accumulate into).
mok::WeightGradArgs weight_grad_args(const WeightGradProblem& p, const DeviceBuffer<uint16_t>& a,
                                     const DeviceBuffer<uint16_t>& b, const DeviceBuffer<int32_t>& offset,
                                     const DeviceBuffer<int32_t>& rows) {
  mok::WeightGradArgs args;
  args.a = a.get();
  args.b = b.get();
  args.group_offset = offset.get();
  args.group_rows = rows.get();
  args.num_groups = p.layout.groups();
  args.m_total = p.layout.m_total;
  args.m = p.m;
  args.n = p.n;
  return args;
}

// The bf16 output, poisoned first -- or, accumulating, `before` plus the sum.
std::vector<uint16_t> run_weight_grad_bf16(const WeightGradProblem& p, int max_ctas = 0,
                                           const std::vector<uint16_t>* before = nullptr) {
  DeviceBuffer<uint16_t> a(p.a), b(p.b), out(p.layout.groups() * p.m * p.n);
  DeviceBuffer<int32_t> offset(p.layout.offset), rows(p.layout.rows);
  if (before != nullptr) {
    out.upload(*before);
  } else {
    MOK_CUDA_CHECK(cudaMemset(out.get(), 0xFF, p.layout.groups() * p.m * p.n * 2));
  }
  mok::WeightGradArgs args = weight_grad_args(p, a, b, offset, rows);
  args.out_bf16 = out.get();
  args.accumulate = before != nullptr;
  args.max_ctas = max_ctas;
  mok::grouped_weight_grad(args);
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  return out.download();
}

std::vector<float> run_weight_grad(const WeightGradProblem& p, const std::vector<float>& out_before,
                                   bool accumulate, int max_ctas = 0) {
  DeviceBuffer<uint16_t> a(p.a), b(p.b);
  DeviceBuffer<float> out(out_before);
  DeviceBuffer<int32_t> offset(p.layout.offset), rows(p.layout.rows);
  mok::WeightGradArgs args = weight_grad_args(p, a, b, offset, rows);
  args.out = out.get();
  args.accumulate = accumulate;
  args.max_ctas = max_ctas;
  mok::grouped_weight_grad(args);
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  return out.download();
}

std::vector<float> poisoned(size_t count) { return std::vector<float>(count, std::nanf("")); }

// sum_r a[r][i] b[r][j] and sum_r |a[r][i] b[r][j]| per group, in double.
void weight_grad_reference(const WeightGradProblem& p, std::vector<double>& sum, std::vector<double>& mag) {
  const int G = p.layout.groups();
  sum.assign(G * p.m * p.n, 0.0);
  mag.assign(G * p.m * p.n, 0.0);
  for (int g = 0; g < G; ++g) {
    for (int32_t r = 0; r < p.layout.rows[g]; ++r) {
      const int64_t row = p.layout.offset[g] + r;
      for (int64_t i = 0; i < p.m; ++i) {
        const double x = bf(p.a[row * p.m + i]);
        double* s = &sum[(g * p.m + i) * p.n];
        double* q = &mag[(g * p.m + i) * p.n];
        for (int64_t j = 0; j < p.n; ++j) {
          const double v = x * bf(p.b[row * p.n + j]);
          s[j] += v;
          q[j] += std::fabs(v);
        }
      }
    }
  }
}

void expect_weight_grad_matches(const WeightGradProblem& p, const std::vector<float>& out) {
  std::vector<double> sum, mag;
  weight_grad_reference(p, sum, mag);
  int bad = 0;
  for (size_t i = 0; i < sum.size(); ++i) {
    // fp32 accumulation over at most a few thousand rows.
    const double tol = 1e-5 * mag[i] + 1e-30;
    if (!(std::fabs(out[i] - sum[i]) <= tol) && bad++ < 5) {
      ADD_FAILURE() << "element " << i << " (group " << i / (p.m * p.n) << "): got " << out[i] << ", want "
                    << sum[i] << " (tolerance " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0) << bad << " elements out of tolerance";
}

// Uneven groups, one empty, unaligned starts, padding (with Inf / NaN) between
// them, a group shorter than one 64-row block and one spanning many; their
// last blocks hold 2, 7, 44, 1 and 26 rows (1, 1, 3, 1 and 2 of the four k16
// steps issued) or a whole block (64).
Layout awkward_groups() {
  return Layout::make({130, 0, 7, 64, 300, 1, 90}, {3, 5, 0, 61, 2, 0, 17}, 9, 4);
}

TEST(WeightGrad, MatchesTheReferenceOnUnevenGroups) {
  MOK_REQUIRE_HOPPER();
  // m = 192: the second tile's upper 64 rows are past m; n = 320: a 64-column
  // partial n-tile.
  const WeightGradProblem p = make_weight_grad(awkward_groups(), 192, 320, 1);
  const std::vector<float> out = run_weight_grad(p, poisoned(p.layout.groups() * p.m * p.n), false);
  expect_weight_grad_matches(p, out);
  // The empty group's gradient is exact zeros.
  for (int64_t i = 0; i < p.m * p.n; ++i) ASSERT_EQ(float_bits(out[p.m * p.n + i]), 0u) << i;
}

TEST(WeightGrad, AccumulatesIntoTheCallersBufferWithOneAddition) {
  MOK_REQUIRE_HOPPER();
  const WeightGradProblem p = make_weight_grad(awkward_groups(), 128, 256, 2);
  const size_t count = p.layout.groups() * p.m * p.n;
  const std::vector<float> fresh = run_weight_grad(p, poisoned(count), false);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<float> before(count);
  for (float& v : before) v = dist(rng);
  const std::vector<float> after = run_weight_grad(p, before, true);
  for (size_t i = 0; i < count; ++i) {
    const bool empty_group = p.layout.rows[i / (p.m * p.n)] == 0;
    const float want = empty_group ? before[i] : before[i] + fresh[i];  // one fp32 addition, round to nearest
    ASSERT_EQ(float_bits(after[i]), float_bits(want)) << "element " << i;
  }
}

// bf16 tiles are stored by TMA from the stage their K loop ended on, which
// the next tile's K loop hands back: with one or three CTAs, each walks many
// tiles in a row -- after an empty group's (no stage held), after a one-row
// group's (a single k-block), across groups and partial tiles -- and every
// one must still be the fp32 sum rounded once, whatever the grid.
TEST(WeightGrad, Bf16OutputIsTheFp32SumRoundedOnce) {
  MOK_REQUIRE_HOPPER();
  const WeightGradProblem p = make_weight_grad(awkward_groups(), 192, 320, 8);
  const std::vector<float> fp32 = run_weight_grad(p, poisoned(p.layout.groups() * p.m * p.n), false);
  for (int ctas : {0, 1, 3}) {
    const std::vector<uint16_t> bf16 = run_weight_grad_bf16(p, ctas);
    for (size_t i = 0; i < fp32.size(); ++i) {
      ASSERT_EQ(bf16[i], mok::float_to_bf16_bits(fp32[i]))
          << "element " << i << " (fp32 " << fp32[i] << "), ctas " << ctas;
    }
  }
}

// Gradient accumulation into a bf16 buffer (a bf16 weight's .grad): the sum
// rounded once, then added to the old value and rounded again -- the bits
// torch gives when it adds the returned bf16 gradient to .grad -- with the
// addition done by the TMA unit as the tile is stored. An empty group leaves
// its gradient as it was. Old values span many binades, with signed zeros.
TEST(WeightGrad, Bf16AccumulateAddsTheRoundedSumAsTorchWould) {
  MOK_REQUIRE_HOPPER();
  const WeightGradProblem p = make_weight_grad(awkward_groups(), 192, 320, 12);
  const size_t count = p.layout.groups() * p.m * p.n;
  const std::vector<float> fp32 = run_weight_grad(p, poisoned(count), false);
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> mantissa(-2.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-24, 8);
  std::vector<uint16_t> before(count);
  for (size_t i = 0; i < count; ++i) {
    const float v = i % 97 == 0 ? (i % 2 ? -0.0f : 0.0f) : std::ldexp(mantissa(rng), exponent(rng));
    before[i] = mok::float_to_bf16_bits(v);
  }
  for (int ctas : {0, 1, 3}) {
    const std::vector<uint16_t> after = run_weight_grad_bf16(p, ctas, &before);
    for (size_t i = 0; i < count; ++i) {
      const bool empty_group = p.layout.rows[i / (p.m * p.n)] == 0;
      const uint16_t grad = mok::float_to_bf16_bits(fp32[i]);
      // The sum of two bf16 values is exact in fp32 unless one is below the
      // other's last bit by far; either way rounding it to bf16 gives the
      // correctly rounded bf16 sum, as an addition in bf16 does.
      const uint16_t want = empty_group ? before[i] : mok::float_to_bf16_bits(bf(before[i]) + bf(grad));
      ASSERT_EQ(after[i], want) << "element " << i << " (old " << bf(before[i]) << ", gradient " << bf(grad)
                                << "), ctas " << ctas;
    }
    ASSERT_EQ(run_weight_grad_bf16(p, ctas, &before), after) << "repeat, ctas " << ctas;
  }
}

TEST(WeightGrad, BitwiseRepeatableAndIndependentOfGridAndPlacement) {
  MOK_REQUIRE_HOPPER();
  const WeightGradProblem p = make_weight_grad(awkward_groups(), 256, 512, 4);
  const size_t count = p.layout.groups() * p.m * p.n;
  const std::vector<float> first = run_weight_grad(p, poisoned(count), false);
  expect_weight_grad_matches(p, first);
  for (int run = 1; run < 20; ++run) ASSERT_EQ(run_weight_grad(p, poisoned(count), false), first) << "run " << run;
  for (int ctas : {1, 3, 7}) EXPECT_EQ(run_weight_grad(p, poisoned(count), false, ctas), first) << "ctas " << ctas;

  // Group 4 (300 rows) alone, at another offset, with other neighbours: the
  // same bits (its sum starts at its own first row, whatever precedes it).
  const int g = 4;
  WeightGradProblem alone;
  alone.layout = Layout::make({5, p.layout.rows[g]}, {11, 3}, 2, 0);
  alone.m = p.m;
  alone.n = p.n;
  std::mt19937 rng(5);
  alone.a = random_bf16(alone.layout.m_total * p.m, rng);
  alone.b = random_bf16(alone.layout.m_total * p.n, rng);
  for (int32_t r = 0; r < p.layout.rows[g]; ++r) {
    std::memcpy(&alone.a[(alone.layout.offset[1] + r) * p.m], &p.a[(p.layout.offset[g] + r) * p.m], p.m * 2);
    std::memcpy(&alone.b[(alone.layout.offset[1] + r) * p.n], &p.b[(p.layout.offset[g] + r) * p.n], p.n * 2);
  }
  const std::vector<float> moved = run_weight_grad(alone, poisoned(2 * p.m * p.n), false);
  for (int64_t i = 0; i < p.m * p.n; ++i) {
    ASSERT_EQ(float_bits(moved[p.m * p.n + i]), float_bits(first[g * p.m * p.n + i])) << "element " << i;
  }
}

// Validation touches no memory: aligned stand-in addresses do (and let these
// run without a GPU).
template <typename T>
T* fake_pointer() {
  return reinterpret_cast<T*>(uintptr_t{1} << 20);
}

TEST(WeightGrad, RejectsBadArguments) {
  mok::WeightGradArgs good;
  good.a = fake_pointer<uint16_t>();
  good.b = fake_pointer<uint16_t>();
  good.out = fake_pointer<float>();
  good.group_offset = fake_pointer<int32_t>();
  good.group_rows = fake_pointer<int32_t>();
  good.num_groups = 1;
  good.m_total = 64;
  good.m = 64;
  good.n = 64;
  EXPECT_NO_THROW(mok::validate_weight_grad(good));
  auto rejected = [](mok::WeightGradArgs args, const char* what) {
    EXPECT_THROW(mok::validate_weight_grad(args), mok::Error) << what;
  };
  { auto x = good; x.m = 96; rejected(x, "m not a multiple of 64"); }
  { auto x = good; x.n = 0; rejected(x, "n = 0"); }
  { auto x = good; x.num_groups = 0; rejected(x, "no groups"); }
  { auto x = good; x.out = nullptr; rejected(x, "no out"); }
  { auto x = good; x.out_bf16 = fake_pointer<uint16_t>(); rejected(x, "both outs"); }
  { auto x = good; x.out = nullptr; x.out_bf16 = fake_pointer<uint16_t>(); EXPECT_NO_THROW(mok::validate_weight_grad(x)); }
  { auto x = good; x.out = nullptr; x.out_bf16 = fake_pointer<uint16_t>(); x.accumulate = true; EXPECT_NO_THROW(mok::validate_weight_grad(x)); }
  { auto x = good; x.a = static_cast<const char*>(good.a) + 2; rejected(x, "misaligned a"); }
  { auto x = good; x.m_total = -1; rejected(x, "negative m_total"); }
}

// ------------------------------------------------------------ SwiGLU backward

struct SwigluBackwardProblem {
  Layout layout;
  int64_t k = 0, n = 0;          // k = H (dout width), n = I
  std::vector<uint16_t> dout;    // [m_total, k]
  std::vector<uint16_t> w2;      // [G, k, n] (nn.Linear's [H, I] per expert)
  std::vector<uint16_t> preact;  // [m_total, 2n]
  std::vector<float> scale;      // [m_total]
};

SwigluBackwardProblem make_swiglu_backward(const Layout& layout, int64_t k, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  SwigluBackwardProblem p;
  p.layout = layout;
  p.k = k;
  p.n = n;
  p.dout = random_bf16(layout.m_total * k, rng);
  p.w2 = random_bf16(layout.groups() * k * n, rng, 2.0f / std::sqrt(static_cast<float>(k)));
  p.preact = random_bf16(layout.m_total * 2 * n, rng, 4.0f);
  std::uniform_real_distribution<float> w(0.05f, 1.0f);
  p.scale.resize(layout.m_total);
  for (float& s : p.scale) s = w(rng);
  plant_non_finite(layout, p.dout, k);
  return p;
}

struct SwigluBackwardResult {
  std::vector<uint16_t> d13, scaled_act;
  std::vector<float> scale_grad;
};

constexpr uint16_t kPoison = 0xFFFF;

SwigluBackwardResult run_swiglu_backward(const SwigluBackwardProblem& p, bool with_scale, int max_ctas = 0) {
  const int64_t m = p.layout.m_total;
  DeviceBuffer<uint16_t> dout(p.dout), w2(p.w2), preact(p.preact);
  DeviceBuffer<float> scale(p.scale);
  DeviceBuffer<uint16_t> d13(m * 2 * p.n), scaled_act(m * p.n);
  DeviceBuffer<float> scale_grad(m), scratch(m * mok::swiglu_backward_parts(p.n));
  DeviceBuffer<int32_t> offset(p.layout.offset), rows(p.layout.rows);
  MOK_CUDA_CHECK(cudaMemset(d13.get(), 0xFF, m * 2 * p.n * 2));
  MOK_CUDA_CHECK(cudaMemset(scaled_act.get(), 0xFF, m * p.n * 2));
  MOK_CUDA_CHECK(cudaMemset(scale_grad.get(), 0xFF, m * 4));
  MOK_CUDA_CHECK(cudaMemset(scratch.get(), 0xFF, m * mok::swiglu_backward_parts(p.n) * 4));
  mok::GroupedGemmArgs args;
  args.a = dout.get();
  args.b = w2.get();
  args.out = d13.get();
  args.group_offset = offset.get();
  args.group_rows = rows.get();
  args.num_groups = p.layout.groups();
  args.m_total = m;
  args.n = p.n;
  args.k = p.k;
  args.epilogue = mok::GemmEpilogue::kSwiGLUBackward;
  args.b_layout = mok::WeightLayout::kKN;
  args.preact = preact.get();
  args.row_scale = with_scale ? scale.get() : nullptr;
  args.scaled_act = scaled_act.get();
  args.row_scale_grad = scale_grad.get();
  args.scratch = scratch.get();
  args.max_ctas = max_ctas;
  mok::grouped_gemm(args);
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  return {d13.download(), scaled_act.download(), scale_grad.download()};
}

void expect_swiglu_backward_matches(const SwigluBackwardProblem& p, const SwigluBackwardResult& got,
                                    bool with_scale) {
  const std::vector<int> owner = p.layout.owner();
  const int64_t n = p.n, k = p.k;
  int bad = 0;
  auto check = [&](double value, double want, double scale, const std::string& what) {
    if (!(std::fabs(value - want) <= 1e-2 * scale + 1e-6) && bad++ < 8) {
      ADD_FAILURE() << what << ": got " << value << ", want " << want;
    }
  };
  std::vector<double> acc(n);
  for (int64_t row = 0; row < p.layout.m_total; ++row) {
    const int g = owner[row];
    if (g < 0) {  // padding rows: never written
      for (int64_t c = 0; c < 2 * n; ++c) ASSERT_EQ(got.d13[row * 2 * n + c], kPoison) << "padding row " << row;
      for (int64_t c = 0; c < n; ++c) ASSERT_EQ(got.scaled_act[row * n + c], kPoison) << "padding row " << row;
      ASSERT_EQ(float_bits(got.scale_grad[row]), 0xFFFFFFFFu) << "padding row " << row;
      continue;
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t o = 0; o < k; ++o) {
      const double d = bf(p.dout[row * k + o]);
      const uint16_t* w = &p.w2[(g * k + o) * n];
      for (int64_t c = 0; c < n; ++c) acc[c] += d * bf(w[c]);
    }
    const double w = with_scale ? p.scale[row] : 1.0;
    double dw = 0.0, dw_mag = 0.0, da_scale = 0.0;
    std::vector<double> da(n), db(n), hw(n);
    for (int64_t c = 0; c < n; ++c) {
      const double gate = bf(p.preact[row * 2 * n + c]), up = bf(p.preact[row * 2 * n + n + c]);
      const double s = 1.0 / (1.0 + std::exp(-gate));
      const double h = gate * s * up;
      const double dh = w * acc[c];
      da[c] = dh * up * s * (1.0 + gate * (1.0 - s));
      db[c] = dh * gate * s;
      hw[c] = w * h;
      dw += acc[c] * h;
      dw_mag += std::fabs(acc[c] * h);
      da_scale = std::max({da_scale, std::fabs(da[c]), std::fabs(db[c])});
    }
    const std::string at = "row " + std::to_string(row);
    for (int64_t c = 0; c < n; ++c) {
      check(bf(got.d13[row * 2 * n + c]), da[c], da_scale, at + " da col " + std::to_string(c));
      check(bf(got.d13[row * 2 * n + n + c]), db[c], da_scale, at + " db col " + std::to_string(c));
      check(bf(got.scaled_act[row * n + c]), hw[c], std::fabs(hw[c]) + 1e-3, at + " w*h col " + std::to_string(c));
    }
    check(got.scale_grad[row], dw, 0.1 * dw_mag, at + " d w");
  }
  EXPECT_EQ(bad, 0) << bad << " values out of tolerance";
}

TEST(SwigluBackward, MatchesTheReferenceOnUnevenGroups) {
  MOK_REQUIRE_HOPPER();
  // n = 320: one full 256-column tile and a 64-column one (two parts of d w).
  const SwigluBackwardProblem p = make_swiglu_backward(awkward_groups(), 256, 320, 6);
  for (bool with_scale : {true, false}) {
    expect_swiglu_backward_matches(p, run_swiglu_backward(p, with_scale), with_scale);
  }
}

TEST(SwigluBackward, BitwiseRepeatableAndIndependentOfTheGrid) {
  MOK_REQUIRE_HOPPER();
  const SwigluBackwardProblem p = make_swiglu_backward(awkward_groups(), 512, 576, 7);
  const SwigluBackwardResult first = run_swiglu_backward(p, true);
  expect_swiglu_backward_matches(p, first, true);
  auto same = [&](const SwigluBackwardResult& r) {
    return r.d13 == first.d13 && r.scaled_act == first.scaled_act &&
           std::memcmp(r.scale_grad.data(), first.scale_grad.data(), first.scale_grad.size() * 4) == 0;
  };
  for (int run = 1; run < 20; ++run) ASSERT_TRUE(same(run_swiglu_backward(p, true))) << "run " << run;
  for (int ctas : {1, 5}) EXPECT_TRUE(same(run_swiglu_backward(p, true, ctas))) << "ctas " << ctas;
}

TEST(SwigluBackward, RejectsBadArguments) {
  mok::GroupedGemmArgs good;
  good.a = fake_pointer<uint16_t>();
  good.b = fake_pointer<uint16_t>();
  good.out = fake_pointer<uint16_t>();
  good.group_offset = fake_pointer<int32_t>();
  good.group_rows = fake_pointer<int32_t>();
  good.num_groups = 1;
  good.m_total = 64;
  good.n = 64;
  good.k = 64;
  good.epilogue = mok::GemmEpilogue::kSwiGLUBackward;
  good.b_layout = mok::WeightLayout::kKN;
  good.preact = fake_pointer<uint16_t>();
  good.row_scale_grad = fake_pointer<float>();
  good.scratch = fake_pointer<float>();
  EXPECT_NO_THROW(mok::validate_grouped_gemm(good));
  { auto x = good; x.b_layout = mok::WeightLayout::kNK; EXPECT_THROW(mok::validate_grouped_gemm(x), mok::Error); }
  { auto x = good; x.preact = nullptr; EXPECT_THROW(mok::validate_grouped_gemm(x), mok::Error); }
  { auto x = good; x.scratch = nullptr; EXPECT_THROW(mok::validate_grouped_gemm(x), mok::Error); }
  { auto x = good; x.row_scale_grad = nullptr; x.scratch = nullptr; EXPECT_NO_THROW(mok::validate_grouped_gemm(x)); }
}

}  // namespace
