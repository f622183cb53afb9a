// Grouped GEMM (plain and fused SwiGLU) against a CPU reference, plus the
// properties the megakernel relies on: untouched padding, bitwise
// repeatability, bitwise placement independence, and host-side rejection of
// bad arguments.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu/gemm_test_support.hpp"
#include "gpu/gpu_test_env.hpp"
#include "mok/bf16.hpp"
#include "mok/error.hpp"
#include "mok/grouped_gemm.hpp"

namespace {

using mok::GemmEpilogue;
using mok::gemm_test::DeviceBuffer;
using mok::gemm_test::Layout;
using mok::gemm_test::random_bf16;

constexpr uint16_t kPoison = 0xFFFF;  // a NaN in bf16

struct Problem {
  Layout layout;
  int64_t n = 0;
  int64_t k = 0;
  GemmEpilogue epilogue = GemmEpilogue::kPlain;
  std::vector<uint16_t> a;  // [m_total, k]
  std::vector<uint16_t> b;  // [G, n or 2n, k]
  // How the kernel gets b: as above, or transposed per group ([G, k, n]).
  mok::WeightLayout b_layout = mok::WeightLayout::kNK;

  int64_t weight_rows() const { return epilogue == GemmEpilogue::kSwiGLU ? 2 * n : n; }
  // b as the kernel reads it.
  std::vector<uint16_t> b_as_stored() const {
    if (b_layout == mok::WeightLayout::kNK) return b;
    std::vector<uint16_t> t(b.size());
    for (int g = 0; g < layout.groups(); ++g) {
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t c = 0; c < k; ++c) {
          t[static_cast<size_t>((g * k + c) * n + r)] = b[static_cast<size_t>((g * n + r) * k + c)];
        }
      }
    }
    return t;
  }
};

Problem make_problem(const Layout& layout, int64_t n, int64_t k, GemmEpilogue epilogue, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.layout = layout;
  p.n = n;
  p.k = k;
  p.epilogue = epilogue;
  p.a = random_bf16(static_cast<size_t>(layout.m_total * k), rng);
  // Weights ~ 1/sqrt(k) so gate values spread over silu's interesting range.
  p.b = random_bf16(static_cast<size_t>(layout.groups() * p.weight_rows() * k), rng,
                    2.0f / std::sqrt(static_cast<float>(k)));
  return p;
}

// Runs the GPU kernel on poisoned output; returns the whole output.
std::vector<uint16_t> run_gpu(const Problem& p, int max_ctas = 0, int raster_band = 0) {
  DeviceBuffer<uint16_t> a(p.a), b(p.b_as_stored());
  DeviceBuffer<uint16_t> out(static_cast<size_t>(p.layout.m_total * p.n));
  DeviceBuffer<int32_t> offset(p.layout.offset), rows(p.layout.rows);
  MOK_CUDA_CHECK(cudaMemset(out.get(), 0xFF, static_cast<size_t>(p.layout.m_total * p.n) * 2));
  mok::GroupedGemmArgs args;
  args.a = a.get();
  args.b = b.get();
  args.out = out.get();
  args.group_offset = offset.get();
  args.group_rows = rows.get();
  args.num_groups = p.layout.groups();
  args.m_total = p.layout.m_total;
  args.n = p.n;
  args.k = p.k;
  args.epilogue = p.epilogue;
  args.b_layout = p.b_layout;
  args.max_ctas = max_ctas;
  args.raster_band = raster_band;
  mok::grouped_gemm(args);
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  return out.download();
}

float silu_mul_reference(float gate, float up) { return gate / (1.0f + std::exp(-gate)) * up; }

// Plain loops, fp32 accumulation in K order; rows split over a few threads.
// Returns float results for owned rows (NaN elsewhere).
std::vector<float> reference(const Problem& p) {
  const int64_t m = p.layout.m_total, n = p.n, k = p.k;
  std::vector<float> af(p.a.size()), bf(p.b.size());
  for (size_t i = 0; i < af.size(); ++i) af[i] = mok::bf16_bits_to_float(p.a[i]);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = mok::bf16_bits_to_float(p.b[i]);
  const std::vector<int> owner = p.layout.owner();
  std::vector<float> ref(static_cast<size_t>(m * n), std::nanf(""));
  auto dot = [&](int64_t row, int g, int64_t wrow) {
    const float* x = &af[static_cast<size_t>(row * k)];
    const float* w = &bf[static_cast<size_t>((g * p.weight_rows() + wrow) * k)];
    float acc = 0.0f;
    for (int64_t i = 0; i < k; ++i) acc += x[i] * w[i];
    return acc;
  };
  auto work = [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int g = owner[static_cast<size_t>(row)];
      if (g < 0) continue;
      for (int64_t col = 0; col < n; ++col) {
        float v = dot(row, g, col);
        if (p.epilogue == GemmEpilogue::kSwiGLU) v = silu_mul_reference(v, dot(row, g, n + col));
        ref[static_cast<size_t>(row * n + col)] = v;
      }
    }
  };
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 16);
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back(work, m * t / threads, m * (t + 1) / threads);
  }
  for (auto& th : pool) th.join();
  return ref;
}

// Owned rows within bf16 tolerance of the reference; every other row still
// poison.
void expect_matches_reference(const Problem& p, const std::vector<uint16_t>& out) {
  const std::vector<float> ref = reference(p);
  const std::vector<int> owner = p.layout.owner();
  int64_t bad = 0, bad_padding = 0;
  for (int64_t row = 0; row < p.layout.m_total; ++row) {
    for (int64_t col = 0; col < p.n; ++col) {
      const size_t i = static_cast<size_t>(row * p.n + col);
      if (owner[static_cast<size_t>(row)] < 0) {
        if (out[i] != kPoison && bad_padding++ < 5) {
          ADD_FAILURE() << "padding row " << row << " col " << col << " was written: 0x" << std::hex
                        << out[i];
        }
        continue;
      }
      const float got = mok::bf16_bits_to_float(out[i]);
      const float want = ref[i];
      const bool ok = std::isfinite(got) && std::fabs(got - want) <= 1e-2f + 1e-2f * std::fabs(want);
      if (!ok && bad++ < 5) {
        ADD_FAILURE() << "row " << row << " (group " << owner[static_cast<size_t>(row)] << ") col "
                      << col << ": got " << got << " want " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0) << "elements off the reference";
  EXPECT_EQ(bad_padding, 0) << "padding elements written";
}

// Empty groups, a 1-row group, groups that are not multiples of the tile
// height (128), padding of odd sizes, unowned tail rows.
Layout awkward_layout() {
  return Layout::make({130, 0, 1, 128, 257, 64}, {3, 0, 17, 0, 5, 40}, /*first=*/11, /*tail=*/7);
}

TEST(GroupedGemm, PlainMatchesReference) {
  MOK_REQUIRE_HOPPER();
  // n = 320: one full 256-column tile and a 64-column partial one;
  // k = 576: 9 k-blocks, so the 4-stage ring wraps inside a tile.
  const Problem p = make_problem(awkward_layout(), 320, 576, GemmEpilogue::kPlain, 1);
  expect_matches_reference(p, run_gpu(p));
}

// B given as [G, k, n] (N contiguous, an MN-major wgmma operand): the layout
// the backward's data gradients read their weights in. Same reference; the
// partial last n-tile (n = 320) and the wrapping stage ring (k = 576) as above.
TEST(GroupedGemm, KByNWeightsMatchReference) {
  MOK_REQUIRE_HOPPER();
  Problem p = make_problem(awkward_layout(), 320, 576, GemmEpilogue::kPlain, 1);
  const std::vector<uint16_t> nk = run_gpu(p);
  p.b_layout = mok::WeightLayout::kKN;
  const std::vector<uint16_t> kn = run_gpu(p);
  expect_matches_reference(p, kn);
  // Bitwise repeatable, and independent of the grid like the K-major path.
  EXPECT_EQ(run_gpu(p), kn);
  EXPECT_EQ(run_gpu(p, 3), kn);
  // Whether the tensor cores sum an MN-major B in the same order as a K-major
  // one: recorded, not required.
  RecordProperty("bitwise_equal_to_nk", nk == kn ? "yes" : "no");
  std::printf("[ info ] k-by-n result %s the n-by-k result bit for bit\n", nk == kn ? "equals" : "differs from");
}

TEST(GroupedGemm, SwigluMatchesReference) {
  MOK_REQUIRE_HOPPER();
  // n = 192: one full 128-output tile and a 64-column partial one.
  const Problem p = make_problem(awkward_layout(), 192, 320, GemmEpilogue::kSwiGLU, 2);
  expect_matches_reference(p, run_gpu(p));
}

TEST(GroupedGemm, ManyTilesPerCtaMatchAndAreBitwiseEqual) {
  MOK_REQUIRE_HOPPER();
  // Few CTAs: each walks many tasks and groups; results must not change by
  // a single bit with the grid size.
  for (GemmEpilogue e : {GemmEpilogue::kPlain, GemmEpilogue::kSwiGLU}) {
    const Problem p = make_problem(awkward_layout(), 512, 384, e, 3);
    const std::vector<uint16_t> full = run_gpu(p);
    expect_matches_reference(p, full);
    for (int ctas : {1, 3, 7}) EXPECT_EQ(run_gpu(p, ctas), full) << "max_ctas " << ctas;
    for (int band : {1, 2, 100}) EXPECT_EQ(run_gpu(p, 0, band), full) << "raster_band " << band;
  }
}

TEST(GroupedGemm, ManyGroupsBeyondTheSharedMemoryTable) {
  MOK_REQUIRE_HOPPER();
  // More groups than the kernel copies to shared memory (512): the walker
  // reads the counts from global memory instead.
  std::mt19937 rng(10);
  std::vector<int32_t> rows(700), padding(700);
  for (size_t g = 0; g < rows.size(); ++g) {
    rows[g] = static_cast<int32_t>(rng() % 5);
    padding[g] = static_cast<int32_t>(rng() % 3);
  }
  for (GemmEpilogue e : {GemmEpilogue::kPlain, GemmEpilogue::kSwiGLU}) {
    const Problem p = make_problem(Layout::make(rows, padding, 1, 1), 128, 64, e, 11);
    expect_matches_reference(p, run_gpu(p));
  }
}

TEST(GroupedGemm, SmallestSupportedSizes) {
  MOK_REQUIRE_HOPPER();
  for (GemmEpilogue e : {GemmEpilogue::kPlain, GemmEpilogue::kSwiGLU}) {
    const Problem one = make_problem(Layout::make({1}, {0}), 64, 64, e, 4);
    expect_matches_reference(one, run_gpu(one));
    const Problem few = make_problem(Layout::make({1, 0, 2}, {5, 1, 0}, 3, 2), 64, 64, e, 5);
    expect_matches_reference(few, run_gpu(few));
  }
}

TEST(GroupedGemm, AllGroupsEmptyWritesNothing) {
  MOK_REQUIRE_HOPPER();
  for (GemmEpilogue e : {GemmEpilogue::kPlain, GemmEpilogue::kSwiGLU}) {
    const Problem p = make_problem(Layout::make({0, 0, 0}, {10, 0, 20}), 128, 128, e, 6);
    const std::vector<uint16_t> out = run_gpu(p);
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint16_t v) { return v == kPoison; }));
  }
}

TEST(GroupedGemm, BitwiseRepeatableOver20Runs) {
  MOK_REQUIRE_HOPPER();
  for (GemmEpilogue e : {GemmEpilogue::kPlain, GemmEpilogue::kSwiGLU}) {
    const Problem p = make_problem(Layout::make({300, 77, 0, 512, 129}, {4, 51, 0, 0, 127}), 512, 512, e, 7);
    const std::vector<uint16_t> first = run_gpu(p);
    expect_matches_reference(p, first);
    for (int run = 1; run < 20; ++run) ASSERT_EQ(run_gpu(p), first) << "run " << run;
  }
}

// The same rows and weights, placed at a different offset (so a different
// position inside their tile) in a group of a different size with different
// neighbours: their output bits must not change.
TEST(GroupedGemm, RowResultIndependentOfPlacementAndGroupSize) {
  MOK_REQUIRE_HOPPER();
  const int64_t n = 256, k = 448;
  for (GemmEpilogue e : {GemmEpilogue::kPlain, GemmEpilogue::kSwiGLU}) {
    // Placement 1: the rows under study are group 1, 200 rows at offset 50.
    const Problem p1 = make_problem(Layout::make({50, 200, 30}, {0, 0, 0}), n, k, e, 8);
    // Placement 2: group 1 starts 37 rows later, holds 61 extra rows after
    // the studied ones, and group 0 is larger.
    Problem p2 = make_problem(Layout::make({80, 261, 9}, {7, 3, 0}), n, k, e, 9);
    p2.b = p1.b;  // same weights
    const int32_t o1 = p1.layout.offset[1], o2 = p2.layout.offset[1];
    ASSERT_NE((o1 % 128), (o2 % 128));
    std::copy(p1.a.begin() + o1 * k, p1.a.begin() + (o1 + 200) * k, p2.a.begin() + o2 * k);

    const std::vector<uint16_t> out1 = run_gpu(p1);
    const std::vector<uint16_t> out2 = run_gpu(p2, 5);
    expect_matches_reference(p1, out1);
    for (int r = 0; r < 200; ++r) {
      ASSERT_TRUE(std::equal(out1.begin() + (o1 + r) * n, out1.begin() + (o1 + r + 1) * n,
                             out2.begin() + (o2 + r) * n))
          << "row " << r << " of the group changed bits when moved";
    }
  }
}

TEST(GroupedGemm, BadArgumentsRejectedBeforeLaunch) {
  MOK_REQUIRE_HOPPER();
  DeviceBuffer<uint16_t> a(64 * 128 + 8), b(2 * 2 * 128 * 128 + 8), out(64 * 128 + 8);
  DeviceBuffer<int32_t> offset(std::vector<int32_t>{0, 32, 64}), rows(std::vector<int32_t>{32, 32});
  auto good = [&] {
    mok::GroupedGemmArgs args;
    args.a = a.get();
    args.b = b.get();
    args.out = out.get();
    args.group_offset = offset.get();
    args.group_rows = rows.get();
    args.num_groups = 2;
    args.m_total = 64;
    args.n = 128;
    args.k = 128;
    return args;
  };
  EXPECT_NO_THROW(mok::validate_grouped_gemm(good()));
  auto expect_rejected = [&](mok::GroupedGemmArgs args, const char* what) {
    EXPECT_THROW(mok::grouped_gemm(args), mok::Error) << what;
  };
  { auto x = good(); x.a = nullptr; expect_rejected(x, "null a"); }
  { auto x = good(); x.b = nullptr; expect_rejected(x, "null b"); }
  { auto x = good(); x.out = nullptr; expect_rejected(x, "null out"); }
  { auto x = good(); x.group_offset = nullptr; expect_rejected(x, "null group_offset"); }
  { auto x = good(); x.group_rows = nullptr; expect_rejected(x, "null group_rows"); }
  { auto x = good(); x.a = a.get() + 1; expect_rejected(x, "a not 16-byte aligned"); }
  { auto x = good(); x.b = b.get() + 4; expect_rejected(x, "b not 16-byte aligned"); }
  { auto x = good(); x.out = out.get() + 2; expect_rejected(x, "out not 16-byte aligned"); }
  { auto x = good(); x.num_groups = 0; expect_rejected(x, "G = 0"); }
  { auto x = good(); x.num_groups = -3; expect_rejected(x, "G < 0"); }
  { auto x = good(); x.k = 96; expect_rejected(x, "k not a multiple of 64"); }
  { auto x = good(); x.k = 0; expect_rejected(x, "k = 0"); }
  { auto x = good(); x.n = 32; expect_rejected(x, "n below 64"); }
  { auto x = good(); x.n = 200; expect_rejected(x, "n not a multiple of 64"); }
  { auto x = good(); x.m_total = -1; expect_rejected(x, "negative m_total"); }
  { auto x = good(); x.m_total = int64_t{1} << 32; expect_rejected(x, "m_total too large"); }
  { auto x = good(); x.max_ctas = -1; expect_rejected(x, "negative max_ctas"); }
  { auto x = good(); x.raster_band = -1; expect_rejected(x, "negative raster_band"); }
  { auto x = good(); x.epilogue = static_cast<GemmEpilogue>(7); expect_rejected(x, "bad epilogue"); }
  { auto x = good(); x.b_layout = static_cast<mok::WeightLayout>(5); expect_rejected(x, "bad b_layout"); }
  {
    auto x = good();
    x.b_layout = mok::WeightLayout::kKN;
    x.epilogue = GemmEpilogue::kSwiGLU;
    expect_rejected(x, "k-by-n weights with the SwiGLU epilogue");
  }
  // The message names the field.
  try {
    auto x = good();
    x.k = 96;
    mok::grouped_gemm(x);
  } catch (const mok::Error& err) {
    EXPECT_NE(std::string(err.what()).find("k = 96"), std::string::npos) << err.what();
  }
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
