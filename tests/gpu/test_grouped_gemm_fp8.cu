// The block-scaled FP8 grouped GEMM (GemmElement::kE4M3: plain, SwiGLU, and
// SwiGLU with h quantized) against a double reference over the dequantized
// operands (the bit-exact host quantizer, include/mok/fp8.hpp, makes both
// sides' inputs): the output's rounding and the tensor cores' FP8
// accumulation are the errors expected. Also: padding rows untouched,
// bitwise repeatable, the same bits at any grid size and with either plain
// tile variant (2-CTA multicast, split N), bad arguments refused.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <random>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu/gemm_test_support.hpp"
#include "gpu/gpu_test_env.hpp"
#include "mok/bf16.hpp"
#include "mok/error.hpp"
#include "mok/fp8.hpp"
#include "mok/grouped_gemm.hpp"

namespace {

using mok::gemm_test::DeviceBuffer;
using mok::gemm_test::Layout;

// 2^-12: Hopper's FP8 accumulation keeps about 14 bits of a partial sum
// whose addends reach the block's magnitude; two bits of slack for the four
// wgmma of a block adding in turn.
constexpr double kAccumulationError = 1.0 / 4096;

struct Fp8Problem {
  Layout layout;
  int64_t n = 0, k = 0;
  bool swiglu = false;               // b holds 2n rows (gate, then up); out = silu(gate) * up
  std::vector<uint8_t> a, a_scales;  // e4m3 [m_total, k], ue8m0 [m_total, k / 128]
  mok::fp8::QuantizedWeight b;       // [G, n, k]
};

// Rows whose magnitudes differ by block (so the scales differ), weights likewise.
Fp8Problem make_problem(const Layout& layout, int64_t n, int64_t k, uint32_t seed, bool swiglu = false) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> octave(-6, 6);
  Fp8Problem p;
  p.layout = layout;
  p.n = n;
  p.k = k;
  p.swiglu = swiglu;
  const int64_t b_rows = swiglu ? 2 * n : n;
  std::vector<float> a(static_cast<size_t>(layout.m_total * k));
  for (int64_t r = 0; r < layout.m_total; ++r) {
    for (int64_t kb = 0; kb < k / 128; ++kb) {
      const float scale = std::ldexp(1.0f, octave(rng));
      for (int64_t c = 0; c < 128; ++c) a[static_cast<size_t>(r * k + kb * 128 + c)] = unit(rng) * scale;
    }
  }
  p.a.resize(a.size());
  p.a_scales.resize(static_cast<size_t>(layout.m_total * (k / 128)));
  mok::fp8::quantize_rows(a, layout.m_total, k, p.a, p.a_scales);
  // Each 128 x 128 weight block gets its own power-of-two magnitude (so the
  // blocks' scales differ, and a kernel reading the wrong block's scale --
  // gate for up, one group or n-tile for another -- is off by a power of
  // two), its elements a spread of a few octaves inside it.
  std::vector<float> b(static_cast<size_t>(layout.groups() * b_rows * k));
  std::vector<float> block_scale(static_cast<size_t>(layout.groups() * (b_rows / 128) * (k / 128)));
  for (auto& s : block_scale) s = std::ldexp(1.0f, octave(rng));
  for (int64_t g = 0; g < layout.groups(); ++g) {
    for (int64_t r = 0; r < b_rows; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        const float s = block_scale[static_cast<size_t>((g * (b_rows / 128) + r / 128) * (k / 128) + c / 128)];
        b[static_cast<size_t>((g * b_rows + r) * k + c)] =
            unit(rng) * s * std::ldexp(1.0f, octave(rng) / 3) / std::sqrt(static_cast<float>(k));
      }
    }
  }
  p.b = mok::fp8::quantize_weight(b, layout.groups(), b_rows, k);
  return p;
}

// A problem's operands and group table on the device, and the arguments
// that name them (the caller adds the output and the epilogue).
struct DeviceProblem {
  DeviceBuffer<uint8_t> a, a_scales, b, b_scales;
  DeviceBuffer<int32_t> offset, rows;
  explicit DeviceProblem(const Fp8Problem& p)
      : a(p.a), a_scales(p.a_scales), b(p.b.values), b_scales(p.b.scales), offset(p.layout.offset),
        rows(p.layout.rows) {}
  mok::GroupedGemmArgs args(const Fp8Problem& p, int max_ctas) const {
    mok::GroupedGemmArgs args;
    args.element = mok::GemmElement::kE4M3;
    args.a = a.get();
    args.a_scales = a_scales.get();
    args.b = b.get();
    args.b_scales = b_scales.get();
    args.group_offset = offset.get();
    args.group_rows = rows.get();
    args.num_groups = p.layout.groups();
    args.m_total = p.layout.m_total;
    args.n = p.n;
    args.k = p.k;
    args.max_ctas = max_ctas;
    return args;
  }
};

// The plain FP8 tile to run: the default 128 x 128, its 2-CTA variant whose
// clusters share A boxes (GroupedGemmArgs::fp8_multicast), or the split-N
// 64 x 256 tile (GroupedGemmArgs::fp8_split_n).
enum class Tile { k128x128, kMulticast, kSplitN };

std::vector<uint16_t> run_fp8(const Fp8Problem& p, int max_ctas = 0, Tile tile = Tile::k128x128) {
  const DeviceProblem d(p);
  DeviceBuffer<uint16_t> out(static_cast<size_t>(p.layout.m_total * p.n));
  MOK_CUDA_CHECK(cudaMemset(out.get(), 0xFF, static_cast<size_t>(p.layout.m_total * p.n) * 2));
  mok::GroupedGemmArgs args = d.args(p, max_ctas);
  args.out = out.get();
  args.fp8_multicast = tile == Tile::kMulticast;
  args.fp8_split_n = tile == Tile::kSplitN;
  args.epilogue = p.swiglu ? mok::GemmEpilogue::kSwiGLU : mok::GemmEpilogue::kPlain;
  mok::grouped_gemm(args);
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  return out.download();
}

void expect_matches_reference(const Fp8Problem& p, const std::vector<uint16_t>& out) {
  const std::vector<int> owner = p.layout.owner();
  const int64_t kb_count = p.k / 128;
  auto a_value = [&](int64_t r, int64_t c) {
    return static_cast<double>(mok::fp8::decode_e4m3(p.a[static_cast<size_t>(r * p.k + c)])) *
           mok::fp8::decode_ue8m0(p.a_scales[static_cast<size_t>(r * kb_count + c / 128)]);
  };
  const int64_t b_rows = p.swiglu ? 2 * p.n : p.n;
  auto b_value = [&](int g, int64_t row, int64_t c) {
    const size_t at = static_cast<size_t>((g * b_rows + row) * p.k + c);
    const size_t scale = static_cast<size_t>((g * (b_rows / 128) + row / 128) * kb_count + c / 128);
    return static_cast<double>(mok::fp8::decode_e4m3(p.b.values[at])) * mok::fp8::decode_ue8m0(p.b.scales[scale]);
  };
  int bad = 0;
  double worst_accumulation = 0;  // the largest error beyond bf16 rounding, as a fraction of `mag`
  for (int64_t r = 0; r < p.layout.m_total; ++r) {
    const int g = owner[static_cast<size_t>(r)];
    for (int64_t col = 0; col < p.n; ++col) {
      const uint16_t got = out[static_cast<size_t>(r * p.n + col)];
      if (g < 0) {
        ASSERT_EQ(got, 0xFFFF) << "row " << r << " belongs to no group but was written";
        continue;
      }
      double sum = 0, mag = 0, up = 0, up_mag = 0;
      for (int64_t c = 0; c < p.k; ++c) {
        const double v = a_value(r, c) * b_value(g, col, c);
        sum += v;
        mag += std::fabs(v);
        if (p.swiglu) {
          const double u = a_value(r, c) * b_value(g, p.n + col, c);
          up += u;
          up_mag += std::fabs(u);
        }
      }
      if (p.swiglu) {  // silu(gate) * up; the magnitude bound follows both factors
        const double silu = sum / (1.0 + std::exp(-sum));
        mag = (mag + 1.0) * (std::fabs(up) + up_mag);
        sum = silu * up;
      }
      const double value = mok::bf16_bits_to_float(got);
      const double err = std::fabs(value - sum);
      // bf16's rounding (half an ulp: 2^-9 of the value; 4e-3 leaves room for
      // the fp32 sums) plus the tensor cores' FP8 accumulation, which keeps
      // about 14 bits of each 128-deep block's partial sum (the DeepSeek-V3
      // report; why the mainloop promotes every 128 of K): its error is a
      // fraction of the magnitudes summed, not of the result, so it is
      // bounded by kAccumulationBits of `mag`. A wrong scale, a swapped
      // block or a dropped stage is off by far more than either term.
      const double accumulation = std::max(0.0, err - 4e-3 * std::fabs(sum)) / mag;
      worst_accumulation = std::max(worst_accumulation, accumulation);
      if (!(err <= 4e-3 * std::fabs(sum) + kAccumulationError * mag) && bad++ < 5) {
        ADD_FAILURE() << "row " << r << " col " << col << ": got " << value << ", want " << sum
                      << " (error " << err << ", " << err / mag << " of the magnitude " << mag << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0);
  std::printf("  largest error beyond bf16 rounding: %.3g of the summed magnitudes (bound %.3g)\n", worst_accumulation,
              kAccumulationError);
}

TEST(GroupedGemmFp8, MatchesTheDequantizedReference) {
  MOK_REQUIRE_HOPPER();
  // Uneven groups, one empty, padding between them; k = 384 (three scale
  // blocks), n = 256 (two n-tiles).
  const Fp8Problem p = make_problem(Layout::make({130, 0, 7, 200}, {3, 5, 61, 0}, 9, 4), 256, 384, 1);
  const std::vector<uint16_t> out = run_fp8(p);
  expect_matches_reference(p, out);
  // The 2-CTA multicast variant (n = 256: one pair of n-tiles) and the
  // split-N tile (one 256-column tile; SplitN... below): the same bits.
  EXPECT_EQ(run_fp8(p, 0, Tile::kMulticast), out);
  EXPECT_EQ(run_fp8(p, 0, Tile::kSplitN), out);
  // One group of 130 rows, nothing after it: the last tile's second 64-row
  // half, which the cluster's rank 1 loads, lies wholly past m_total (TMA
  // zero fill, still counted on both CTAs' barriers).
  const Fp8Problem edge = make_problem(Layout::make({130}, {0}), 256, 256, 6);
  const std::vector<uint16_t> edge_out = run_fp8(edge);
  expect_matches_reference(edge, edge_out);
  EXPECT_EQ(run_fp8(edge, 0, Tile::kMulticast), edge_out);
  EXPECT_EQ(run_fp8(edge, 0, Tile::kSplitN), edge_out);
}

TEST(GroupedGemmFp8, SwiGLUMatchesTheDequantizedReference) {
  MOK_REQUIRE_HOPPER();
  // n = 192: three 64-column tiles; the up rows start at 192, inside a
  // 128-row scale block (rows 128..255), so gate and up halves of a tile
  // take different B scales.
  const Fp8Problem p = make_problem(Layout::make({130, 0, 7, 200}, {3, 5, 61, 0}, 9, 4), 192, 256, 3, true);
  expect_matches_reference(p, run_fp8(p));
}

TEST(GroupedGemmFp8, BitwiseRepeatableAndIndependentOfTheGrid) {
  MOK_REQUIRE_HOPPER();
  const Fp8Problem p = make_problem(Layout::make({300, 77, 512}, {4, 51, 0}), 512, 512, 2);
  const std::vector<uint16_t> first = run_fp8(p);
  expect_matches_reference(p, first);
  for (int run = 1; run < 10; ++run) ASSERT_EQ(run_fp8(p), first) << "run " << run;
  for (int ctas : {1, 7}) EXPECT_EQ(run_fp8(p, ctas), first) << "ctas " << ctas;
  // The multicast variant: the same bits, repeatably, at any cluster count
  // (max_ctas 1 still launches one cluster of two; 7 gives three clusters).
  for (int ctas : {0, 0, 1, 7}) EXPECT_EQ(run_fp8(p, ctas, Tile::kMulticast), first) << "multicast, ctas " << ctas;
  for (int ctas : {0, 0, 1, 7}) EXPECT_EQ(run_fp8(p, ctas, Tile::kSplitN), first) << "split N, ctas " << ctas;
}

// The split-N tile (fp8_split_n: 64 rows; warpgroup 0 computes columns
// n0 .. n0 + 127, warpgroup 1 n0 + 128 .. n0 + 255 of the same rows). Each
// element is the 128 x 128 tile's computation exactly -- the same four
// m64n128k32 wgmma per stage over the same row of A and the same 128-row B
// block (even at the same column of the wgmma: 128-column blocks line up),
// promoted with the same two scales -- so the outputs must be the same bits,
// not merely close.
TEST(GroupedGemmFp8, SplitNMatchesTheReferenceAndThe128x128Tile) {
  MOK_REQUIRE_HOPPER();
  // Uneven groups (130, 7 and 200 rows: tiles that end inside a group and
  // tiles that straddle a boundary), an empty group, a 64-row group at an
  // offset that is no multiple of 64, padding between them and a tail;
  // n = 768 (three tiles, six B scale blocks a group, each with its own
  // magnitude: warpgroup 1 reading warpgroup 0's block is off by powers of
  // two), k = 384.
  const Fp8Problem p = make_problem(Layout::make({130, 0, 7, 200, 64}, {3, 5, 61, 0, 2}, 9, 4), 768, 384, 11);
  const std::vector<uint16_t> split = run_fp8(p, 0, Tile::kSplitN);
  expect_matches_reference(p, split);
  EXPECT_EQ(split, run_fp8(p)) << "split N and 128 x 128 differ";
  for (int run = 1; run < 5; ++run) ASSERT_EQ(run_fp8(p, 0, Tile::kSplitN), split) << "run " << run;
  for (int ctas : {1, 7, 33}) EXPECT_EQ(run_fp8(p, ctas, Tile::kSplitN), split) << "ctas " << ctas;
  // One 128-deep K block (the mainloop's shortest path), one 256-column
  // tile, a single group of 37 rows with no padding or tail: the only tile's
  // rows 37..63 lie past m_total (TMA's zero fill, never stored).
  const Fp8Problem tiny = make_problem(Layout::make({37}, {0}), 256, 128, 12);
  const std::vector<uint16_t> tiny_out = run_fp8(tiny, 0, Tile::kSplitN);
  expect_matches_reference(tiny, tiny_out);
  EXPECT_EQ(tiny_out, run_fp8(tiny));
}

// The FP8 gate/up with h quantized in the epilogue (kSwiGLUQuantize): the
// bytes and scales of every owned row, nothing else written.
struct QuantizedH {
  std::vector<uint8_t> values, scales;  // e4m3 [m_total, n], ue8m0 [m_total, n / 128]
};

QuantizedH run_fp8_quantize(const Fp8Problem& p, int max_ctas = 0) {
  const DeviceProblem d(p);
  DeviceBuffer<uint8_t> out(static_cast<size_t>(p.layout.m_total * p.n)),
      out_scales(static_cast<size_t>(p.layout.m_total * (p.n / 128)));
  MOK_CUDA_CHECK(cudaMemset(out.get(), 0xAB, static_cast<size_t>(p.layout.m_total * p.n)));
  MOK_CUDA_CHECK(cudaMemset(out_scales.get(), 0xCD, static_cast<size_t>(p.layout.m_total * (p.n / 128))));
  mok::GroupedGemmArgs args = d.args(p, max_ctas);
  args.epilogue = mok::GemmEpilogue::kSwiGLUQuantize;
  args.out = out.get();
  args.out_scales = out_scales.get();
  mok::grouped_gemm(args);
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  return {out.download(), out_scales.download()};
}

void expect_quantized_h_matches(const Fp8Problem& p, const QuantizedH& got) {
  const std::vector<int> owner = p.layout.owner();
  const int64_t kb_count = p.k / 128, blocks = p.n / 128;
  auto a_value = [&](int64_t r, int64_t c) {
    return static_cast<double>(mok::fp8::decode_e4m3(p.a[static_cast<size_t>(r * p.k + c)])) *
           mok::fp8::decode_ue8m0(p.a_scales[static_cast<size_t>(r * kb_count + c / 128)]);
  };
  auto b_value = [&](int g, int64_t row, int64_t c) {
    const size_t at = static_cast<size_t>((g * 2 * p.n + row) * p.k + c);
    const size_t scale = static_cast<size_t>((g * (2 * p.n / 128) + row / 128) * kb_count + c / 128);
    return static_cast<double>(mok::fp8::decode_e4m3(p.b.values[at])) * mok::fp8::decode_ue8m0(p.b.scales[scale]);
  };
  int bad = 0;
  for (int64_t r = 0; r < p.layout.m_total; ++r) {
    const int g = owner[static_cast<size_t>(r)];
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const uint8_t scale = got.scales[static_cast<size_t>(r * blocks + blk)];
      if (g < 0) {
        ASSERT_EQ(scale, 0xCD) << "row " << r << " belongs to no group but its scale was written";
        for (int64_t c = 0; c < 128; ++c) {
          ASSERT_EQ(got.values[static_cast<size_t>(r * p.n + blk * 128 + c)], 0xAB) << "row " << r << " written";
        }
        continue;
      }
      // The scale rule, exactly: the block's largest |value| / 2^e lies in
      // (224, 448], which e4m3 rounding keeps in [224, 448].
      const double step = std::ldexp(1.0, static_cast<int>(scale) - 127);
      double qmax = 0;
      for (int64_t c = 0; c < 128; ++c) {
        qmax = std::max(qmax, std::fabs(static_cast<double>(
                                  mok::fp8::decode_e4m3(got.values[static_cast<size_t>(r * p.n + blk * 128 + c)]))));
      }
      if (!(qmax >= 224.0 && qmax <= 448.0) && bad++ < 5) {
        ADD_FAILURE() << "row " << r << " block " << blk << ": scale 2^" << static_cast<int>(scale) - 127
                      << " leaves a largest value of " << qmax << " (want [224, 448])";
      }
      for (int64_t c = 0; c < 128; ++c) {
        const int64_t col = blk * 128 + c;
        double gate = 0, up = 0, gate_mag = 0, up_mag = 0;
        for (int64_t kk = 0; kk < p.k; ++kk) {
          const double x = a_value(r, kk);
          gate += x * b_value(g, col, kk);
          gate_mag += std::fabs(x * b_value(g, col, kk));
          up += x * b_value(g, p.n + col, kk);
          up_mag += std::fabs(x * b_value(g, p.n + col, kk));
        }
        const double want = gate / (1.0 + std::exp(-gate)) * up;
        const double value =
            static_cast<double>(mok::fp8::decode_e4m3(got.values[static_cast<size_t>(r * p.n + col)])) * step;
        // e4m3's rounding (half an ulp: 2^-4 of the value; 2^-10 of the scale
        // below the normal range), the fp32 SwiGLU (4e-3 as in the bf16
        // tests) and the accumulation of gate and up (kAccumulationError).
        const double mag = (gate_mag + 1.0) * (std::fabs(up) + up_mag);
        const double tol = (1.0 / 16 + 4e-3) * std::fabs(want) + step / 1024 + kAccumulationError * mag;
        if (!(std::fabs(value - want) <= tol) && bad++ < 5) {
          ADD_FAILURE() << "row " << r << " col " << col << ": got " << value << ", want " << want << " (tolerance "
                        << tol << ")";
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(GroupedGemmFp8, SwiGLUQuantizeMatchesTheReferenceAndTheScaleRule) {
  MOK_REQUIRE_HOPPER();
  // n = 256: two 128-column tiles (two scale blocks per row); uneven groups,
  // one empty, padding between them and a tail; 64-row tiles straddle the
  // group boundaries.
  const Fp8Problem p = make_problem(Layout::make({130, 0, 7, 200}, {3, 5, 61, 0}, 9, 4), 256, 384, 5, true);
  const QuantizedH first = run_fp8_quantize(p);
  expect_quantized_h_matches(p, first);
  for (int run = 1; run < 3; ++run) {
    const QuantizedH again = run_fp8_quantize(p);
    ASSERT_EQ(again.values, first.values) << "run " << run;
    ASSERT_EQ(again.scales, first.scales) << "run " << run;
  }
  for (int ctas : {1, 7}) {
    const QuantizedH other = run_fp8_quantize(p, ctas);
    EXPECT_EQ(other.values, first.values) << "ctas " << ctas;
    EXPECT_EQ(other.scales, first.scales) << "ctas " << ctas;
  }
}

TEST(GroupedGemmFp8, RejectsWhatItCannotRun) {
  auto fake = [](uintptr_t at) { return reinterpret_cast<void*>(at << 20); };
  mok::GroupedGemmArgs good;
  good.element = mok::GemmElement::kE4M3;
  good.a = fake(1);
  good.b = fake(2);
  good.out = fake(3);
  good.a_scales = static_cast<const uint8_t*>(fake(4));
  good.b_scales = static_cast<const uint8_t*>(fake(5));
  good.group_offset = static_cast<const int32_t*>(fake(6));
  good.group_rows = static_cast<const int32_t*>(fake(7));
  good.num_groups = 1;
  good.m_total = 128;
  good.n = 128;
  good.k = 128;
  EXPECT_NO_THROW(mok::validate_grouped_gemm(good));
  auto refused = [](mok::GroupedGemmArgs args, const char* what) {
    EXPECT_THROW(mok::validate_grouped_gemm(args), mok::Error) << what;
  };
  { auto x = good; x.k = 192; refused(x, "k not a multiple of 128"); }
  { auto x = good; x.n = 64; refused(x, "n not a multiple of 128"); }
  { auto x = good; x.a_scales = nullptr; refused(x, "no a scales"); }
  { auto x = good; x.b_scales = nullptr; refused(x, "no b scales"); }
  { auto x = good; x.epilogue = mok::GemmEpilogue::kSwiGLUBackward; refused(x, "SwiGLU backward"); }
  { auto x = good; x.epilogue = mok::GemmEpilogue::kSwiGLU; x.n = 64; EXPECT_NO_THROW(mok::validate_grouped_gemm(x)); }
  { auto x = good; x.epilogue = mok::GemmEpilogue::kSwiGLU; x.n = 96; refused(x, "SwiGLU n not a multiple of 64"); }
  { auto x = good; x.b_layout = mok::WeightLayout::kKN; refused(x, "k-by-n b"); }
  auto quantize = good;
  quantize.epilogue = mok::GemmEpilogue::kSwiGLUQuantize;
  quantize.out_scales = static_cast<uint8_t*>(fake(8));
  EXPECT_NO_THROW(mok::validate_grouped_gemm(quantize));
  { auto x = quantize; x.out_scales = nullptr; refused(x, "SwiGLU-quantize without out_scales"); }
  { auto x = quantize; x.n = 192; refused(x, "SwiGLU-quantize n not a multiple of 128"); }
  { auto x = quantize; x.element = mok::GemmElement::kBF16; refused(x, "SwiGLU-quantize on bf16"); }
  auto split = good;
  split.fp8_split_n = true;
  split.n = 256;
  EXPECT_NO_THROW(mok::validate_grouped_gemm(split));
  { auto x = split; x.n = 7168; EXPECT_NO_THROW(mok::validate_grouped_gemm(x)); }
  { auto x = split; x.n = 128; refused(x, "split N, n not a multiple of 256"); }
  { auto x = split; x.n = 384; refused(x, "split N, n not a multiple of 256"); }
  { auto x = split; x.fp8_multicast = true; refused(x, "split N with multicast"); }
  { auto x = split; x.epilogue = mok::GemmEpilogue::kSwiGLU; refused(x, "split N with SwiGLU"); }
  {
    auto x = split;
    x.epilogue = mok::GemmEpilogue::kSwiGLUQuantize;
    x.out_scales = static_cast<uint8_t*>(fake(8));
    refused(x, "split N with SwiGLU-quantize (its own tile)");
  }
  { auto x = split; x.element = mok::GemmElement::kBF16; refused(x, "split N on bf16"); }
}

}  // namespace
