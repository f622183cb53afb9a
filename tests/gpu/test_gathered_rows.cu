// Operands gathered on load through the C++ API (WeightGradArgs::a_rows /
// b_rows, GroupedGemmArgs::a_rows with the SwiGLU-backward epilogue): the
// same bits as the same call on the gathered copy, outputs poisoned first;
// source rows that no group row points at hold Inf / NaN and must not reach
// any output; bad arguments are refused before any launch.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu/gemm_test_support.hpp"
#include "gpu/gpu_test_env.hpp"
#include "mok/error.hpp"
#include "mok/grouped_gemm.hpp"
#include "mok/weight_grad.hpp"

namespace {

using mok::gemm_test::DeviceBuffer;
using mok::gemm_test::Layout;
using mok::gemm_test::random_bf16;

// Uneven groups, one empty, padding between them, a group shorter than one
// 64-row block and one spanning several.
Layout awkward_groups() { return Layout::make({130, 0, 7, 64, 300, 1}, {3, 5, 0, 61, 2, 0}, 9, 4); }

constexpr int64_t kSourceRows = 900;

// A source of kSourceRows rows whose every fourth row is Inf / NaN, and an
// index that sends each group row to a finite row and every other row (padding,
// tail) to a non-finite one, which therefore must never be read.
struct Gather {
  std::vector<int32_t> index;  // [m_total]
};

Gather make_gather(const Layout& layout, std::mt19937& rng) {
  const std::vector<int> owner = layout.owner();
  std::uniform_int_distribution<int32_t> finite(0, static_cast<int32_t>(kSourceRows / 4) - 1);
  Gather g;
  for (int64_t r = 0; r < layout.m_total; ++r) {
    g.index.push_back(owner[static_cast<size_t>(r)] >= 0 ? 4 * finite(rng) + 1 + static_cast<int32_t>(r % 3) : 0);
  }
  return g;
}

std::vector<uint16_t> make_source(int64_t width, std::mt19937& rng) {
  std::vector<uint16_t> v = random_bf16(kSourceRows * width, rng);
  for (int64_t r = 0; r < kSourceRows; r += 4) {
    for (int64_t c = 0; c < width; ++c) v[r * width + c] = (c % 2) ? 0x7F80 : 0x7FC0;  // +Inf, NaN
  }
  return v;
}

std::vector<uint16_t> gathered_copy(const std::vector<uint16_t>& source, const Gather& g, int64_t width) {
  std::vector<uint16_t> out(g.index.size() * width);
  for (size_t r = 0; r < g.index.size(); ++r) {
    std::memcpy(&out[r * width], &source[static_cast<size_t>(g.index[r]) * width], width * 2);
  }
  return out;
}

// The weight gradient's output bytes (fp32, or bf16 with `bf16`; poisoned
// with 0xFF first), each operand either a plain [m_total, width] buffer
// (index null) or a source read through `index`; max_ctas 1 or 2 makes every
// CTA run many tiles (the stage ring wraps, a bf16 tile's held stage is
// handed back and refilled).
std::vector<uint8_t> weight_grad(const Layout& layout, int64_t m, int64_t n, const std::vector<uint16_t>& a,
                                 const std::vector<uint16_t>& b, const DeviceBuffer<int32_t>* a_index,
                                 const DeviceBuffer<int32_t>* b_index, bool bf16, int max_ctas) {
  DeviceBuffer<uint16_t> da(a), db(b);
  const size_t bytes = layout.groups() * m * n * (bf16 ? 2 : 4);
  DeviceBuffer<uint8_t> out(bytes);
  DeviceBuffer<int32_t> offset(layout.offset), rows(layout.rows);
  MOK_CUDA_CHECK(cudaMemset(out.get(), 0xFF, bytes));
  mok::WeightGradArgs args;
  args.a = da.get();
  args.b = db.get();
  if (bf16) {
    args.out_bf16 = out.get();
  } else {
    args.out = reinterpret_cast<float*>(out.get());
  }
  args.group_offset = offset.get();
  args.group_rows = rows.get();
  args.num_groups = layout.groups();
  args.m_total = layout.m_total;
  args.m = m;
  args.n = n;
  args.max_ctas = max_ctas;
  if (a_index != nullptr) {
    args.a_rows = a_index->get();
    args.a_source_rows = kSourceRows;
  }
  if (b_index != nullptr) {
    args.b_rows = b_index->get();
    args.b_source_rows = kSourceRows;
  }
  mok::grouped_weight_grad(args);
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  return out.download();
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
}

TEST(GatheredRows, WeightGradReadsThroughTheIndexWithTheCopysBits) {
  MOK_REQUIRE_HOPPER();
  const Layout layout = awkward_groups();
  const int64_t m = 192, n = 320;
  std::mt19937 rng(11);
  const Gather g = make_gather(layout, rng);
  const std::vector<uint16_t> a_source = make_source(m, rng), b_source = make_source(n, rng);
  const std::vector<uint16_t> a_copy = gathered_copy(a_source, g, m), b_copy = gathered_copy(b_source, g, n);
  const DeviceBuffer<int32_t> index(g.index);
  for (const bool bf16 : {false, true}) {
    const std::vector<uint8_t> want = weight_grad(layout, m, n, a_copy, b_copy, nullptr, nullptr, bf16, 0);
    if (!bf16) {
      std::vector<float> sums(want.size() / 4);
      std::memcpy(sums.data(), want.data(), want.size());
      for (float v : sums) ASSERT_TRUE(std::isfinite(v)) << "the copy's sums read no non-finite row";
    }
    for (const int ctas : {0, 1, 2}) {
      const std::string at = std::string(bf16 ? "bf16" : "fp32") + ", max_ctas " + std::to_string(ctas);
      EXPECT_EQ(weight_grad(layout, m, n, a_source, b_copy, &index, nullptr, bf16, ctas), want) << "a, " << at;
      EXPECT_EQ(weight_grad(layout, m, n, a_copy, b_source, nullptr, &index, bf16, ctas), want) << "b, " << at;
      EXPECT_EQ(weight_grad(layout, m, n, a_source, b_source, &index, &index, bf16, ctas), want) << "a, b, " << at;
    }
  }
}

struct SwigluOut {
  std::vector<uint16_t> d13, act;
  std::vector<float> dw;
};

SwigluOut swiglu_backward(const Layout& layout, int64_t k, int64_t n, const std::vector<uint16_t>& dout,
                          const std::vector<uint16_t>& w2, const std::vector<uint16_t>& preact,
                          const std::vector<float>& scale, const DeviceBuffer<int32_t>* index, int max_ctas) {
  const int64_t m = layout.m_total;
  DeviceBuffer<uint16_t> d_dout(dout), d_w2(w2), d_preact(preact), d13(m * 2 * n), act(m * n);
  DeviceBuffer<float> d_scale(scale), dw(m), scratch(m * mok::swiglu_backward_parts(n));
  DeviceBuffer<int32_t> offset(layout.offset), rows(layout.rows);
  MOK_CUDA_CHECK(cudaMemset(d13.get(), 0xFF, m * 2 * n * 2));
  MOK_CUDA_CHECK(cudaMemset(act.get(), 0xFF, m * n * 2));
  MOK_CUDA_CHECK(cudaMemset(dw.get(), 0xFF, m * 4));
  mok::GroupedGemmArgs args;
  args.a = d_dout.get();
  args.b = d_w2.get();
  args.out = d13.get();
  args.group_offset = offset.get();
  args.group_rows = rows.get();
  args.num_groups = layout.groups();
  args.m_total = m;
  args.n = n;
  args.k = k;
  args.epilogue = mok::GemmEpilogue::kSwiGLUBackward;
  args.b_layout = mok::WeightLayout::kKN;
  args.preact = d_preact.get();
  args.row_scale = d_scale.get();
  args.scaled_act = act.get();
  args.row_scale_grad = dw.get();
  args.scratch = scratch.get();
  args.max_ctas = max_ctas;
  if (index != nullptr) {
    args.a_rows = index->get();
    args.a_source_rows = kSourceRows;
  }
  mok::grouped_gemm(args);
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  return {d13.download(), act.download(), dw.download()};
}

TEST(GatheredRows, SwigluBackwardReadsDoutThroughTheIndexWithTheCopysBits) {
  MOK_REQUIRE_HOPPER();
  const Layout layout = awkward_groups();
  const int64_t k = 320, n = 320;  // k: five k-blocks, so the 4-stage ring wraps inside a tile
  std::mt19937 rng(12);
  const Gather g = make_gather(layout, rng);
  const std::vector<uint16_t> dout = make_source(k, rng);
  const std::vector<uint16_t> w2 = random_bf16(layout.groups() * k * n, rng, 0.125f);
  const std::vector<uint16_t> preact = random_bf16(layout.m_total * 2 * n, rng, 4.0f);
  std::vector<float> scale(layout.m_total);
  std::uniform_real_distribution<float> w(0.05f, 1.0f);
  for (float& s : scale) s = w(rng);
  const SwigluOut want = swiglu_backward(layout, k, n, gathered_copy(dout, g, k), w2, preact, scale, nullptr, 0);
  const DeviceBuffer<int32_t> index(g.index);
  for (const int ctas : {0, 0, 1, 2}) {  // twice with every SM, then every CTA running many tiles
    const SwigluOut got = swiglu_backward(layout, k, n, dout, w2, preact, scale, &index, ctas);
    EXPECT_EQ(got.d13, want.d13) << "max_ctas " << ctas;
    EXPECT_EQ(got.act, want.act) << "max_ctas " << ctas;
    EXPECT_TRUE(same_bits(got.dw, want.dw)) << "max_ctas " << ctas;
  }
}

TEST(GatheredRows, BadArgumentsAreRefusedBeforeAnyLaunch) {
  const auto* some = reinterpret_cast<const int32_t*>(uintptr_t{256});  // never dereferenced: validation only
  mok::WeightGradArgs w;
  w.num_groups = 1;
  w.m = w.n = 64;
  w.m_total = 5;
  w.a = w.b = some;
  w.out = reinterpret_cast<float*>(uintptr_t{256});
  w.group_offset = w.group_rows = some;
  w.b_rows = some;
  w.b_source_rows = 10;
  EXPECT_NO_THROW(mok::validate_weight_grad(w));
  w.b_source_rows = 0;
  EXPECT_THROW(mok::validate_weight_grad(w), mok::Error);  // rows to gather from a source of none
  w.m_total = 0;
  EXPECT_NO_THROW(mok::validate_weight_grad(w));  // no rows at all: nothing is read
  mok::GroupedGemmArgs g;
  g.num_groups = 1;
  g.k = g.n = 64;
  g.a_rows = some;
  g.a_source_rows = 10;
  EXPECT_THROW(mok::validate_grouped_gemm(g), mok::Error);  // the plain epilogue reads no gathered a
}

}  // namespace
