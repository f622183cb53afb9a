// The fused FP8 forward (LayerConfig::dtype kFP8E4M3, virtual world) against
// the CPU reference's FP8 recipe, its determinism (bitwise identical across
// runs, world sizes, minibatch and ring sizes, SM splits, host- and
// device-ordered passes), and its refusals.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_env.hpp"
#include "mok/bf16.hpp"
#include "mok/device_layer.hpp"
#include "mok/error.hpp"
#include "mok/fused_backward.hpp"
#include "mok/fused_forward.hpp"
#include "mok/presets.hpp"
#include "mok/reference.hpp"
#include "mok/schedule.hpp"
#include "mok/synthetic.hpp"
#include "world/fp8_weights.hpp"
#include "world/fused_kernel.hpp"

namespace {

using mok::synthetic::RoutingMode;

// A layer's tensors as an fp8 layer's pass takes them: x, routing, outputs
// and the shared expert from a DeviceLayer (bf16), the routed experts'
// weights quantized (e4m3 values and ue8m0 scales).
struct Fp8Device {
  explicit Fp8Device(const mok::synthetic::Layer& layer) : device(layer), weights(layer) {}
  std::vector<mok::RankTensors> tensors() const { return weights.apply(device.tensors()); }
  mok::DeviceLayer device;
  mok::world::Fp8RoutedWeights weights;
};

mok::LayerConfig fp8_config(const char* preset, std::vector<int> tokens) {
  return mok::make_config(mok::find_shape(preset), std::move(tokens), mok::DType::kFP8E4M3);
}
mok::LayerConfig fp8_config(const mok::LayerShape& shape, std::vector<int> tokens) {
  return mok::make_config(shape, std::move(tokens), mok::DType::kFP8E4M3);
}

mok::FusedForwardOptions small_ring(int minibatch_rows, int ring_slots) {
  mok::FusedForwardOptions o;
  o.minibatch_rows = minibatch_rows;
  o.ring_slots = ring_slots;
  o.timeout_seconds = 5;
  return o;
}

std::vector<uint16_t> run_fused(Fp8Device& d, const mok::LayerConfig& config, const mok::FusedForwardOptions& options) {
  mok::FusedForward forward(config, options);
  d.device.poison_outputs();
  forward.run(d.tensors());
  forward.check();
  return d.device.download_outputs();
}

// The CPU reference of the layer's own dtype (for an fp8 layer, the FP8
// recipe: include/mok/reference.hpp), every rank's output concatenated.
std::vector<double> reference_out(const mok::synthetic::Layer& layer) {
  const auto routing = layer.routing();
  const auto schedule = mok::build_schedule(layer.config, routing, {128, 1});
  mok::ReferenceOptions options;
  options.num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto forward = mok::reference_forward(layer.inputs(), schedule, options);
  std::vector<double> all;
  for (const auto& rank : forward.out) all.insert(all.end(), rank.begin(), rank.end());
  return all;
}

// How far the kernel's output is from the FP8 reference, and why these bounds.
//
// The kernel and the reference quantize x and the weights to the same bytes
// (the same bit-exact rule, include/mok/fp8.hpp, on the same bf16-exact
// inputs), so they differ only in how sums are rounded: the kernel's FP8
// tensor-core sums (promoted to fp32 every 128 of K) against the
// reference's sequential fp32 dot products, relative differences of order
// 1e-4 of the summed magnitudes. Alone these sit far below the bf16 output's
// own rounding (2^-9). But h is quantized between the GEMMs:
//   - an h value that close to an e4m3 rounding midpoint rounds one step
//     (one e4m3 ulp, 2^-4 to 2^-3 of the value) the other way. The flip
//     rate is about 2 x 1e-4 / 2^-3.5 ~ 2e-3 per value, a few flips per
//     row at I = 512. One flip moves y_n = sum_i w2[n, i] h_i by
//     |w2[n, i]| ulp(h_i), against rms(y) ~ sqrt(I) rms(w2 h): about
//     2^-3 / sqrt(128) x |h_i| / rms(h) <= 0.05 rms(y) for a value at 4x
//     the row's rms, ~0.01 rms(y) typically;
//   - a row block whose amax lies that close to 448 x 2^e takes the other
//     scale exponent: all of its 128 values round on a grid twice as coarse
//     (or fine), each moving by up to ~2^-4 of itself, independently: y_n
//     moves by ~2^-4 x (the block's share of y) ~ 0.07 rms(y), rarely more.
// out = bf16(s + sum_j w_j y_j) with routing weights w_j <= 1 summing to 1;
// rms(out) >= ~rms(y) / sqrt(k) (independent slots, plus the shared part),
// so one bad row moves an output element by at most ~0.07 x sqrt(4) ~ 0.15
// rms(out) (top-4 presets; top-2 and top-3 less). Hence
//   max |out - ref| <= 0.25 rms(ref)                                  (1)
// while a real fault -- a block scale off by 2x, a lost or doubled slot, a
// stale ring row, an unwritten (NaN) output -- moves elements by ~rms(y) or
// more. And since flips are rare and small, nearly every element is much
// closer:
//   at most 1% of the elements off by more than 0.02 rms(ref)         (2)
//   relative L2 error < 1e-2                                           (3)
// (the bf16 forward's bound; the FP8 recipe itself is ~3e-2 from the bf16
// layer, tests/cpu/test_reference_fp8.cpp, so (3) also tells an FP8 result
// from a bf16 one).
struct Fp8Error {
  double max_over_rms = 0;  // max |out - ref| / rms(ref)
  double far_share = 0;     // share of elements with |out - ref| > 0.02 rms(ref)
  double relative_l2 = 0;
  size_t unwritten = 0;     // NaN outputs (poisoned, never written)
  size_t worst = 0;
};

Fp8Error fp8_error(const std::vector<uint16_t>& out, const std::vector<double>& ref) {
  Fp8Error e;
  double ref2 = 0;
  for (double v : ref) ref2 += v * v;
  const double rms = std::sqrt(ref2 / static_cast<double>(std::max<size_t>(ref.size(), 1)));
  size_t far = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double got = mok::bf16_bits_to_float(out[i]);
    if (std::isnan(got)) {
      ++e.unwritten;
      continue;
    }
    const double diff = std::fabs(got - ref[i]) / rms;
    if (diff > 0.02) ++far;
    if (diff > e.max_over_rms) {
      e.max_over_rms = diff;
      e.worst = i;
    }
  }
  e.far_share = static_cast<double>(far) / static_cast<double>(std::max<size_t>(out.size(), 1));
  e.relative_l2 = mok::relative_l2_error(out, {ref});
  return e;
}

void expect_close_to_reference(const std::vector<uint16_t>& out, const std::vector<double>& ref) {
  ASSERT_EQ(out.size(), ref.size());
  const Fp8Error e = fp8_error(out, ref);
  std::printf("[ info ] fp8 vs FP8 reference: max %.4f rms, %.5f of elements beyond 0.02 rms, relative L2 %.2e\n",
              e.max_over_rms, e.far_share, e.relative_l2);
  EXPECT_EQ(e.unwritten, 0u) << "outputs never written";
  EXPECT_LE(e.max_over_rms, 0.25) << "worst element " << e.worst << ": got "
                                  << mok::bf16_bits_to_float(out[e.worst]) << " want " << ref[e.worst];
  EXPECT_LE(e.far_share, 0.01);
  EXPECT_LT(e.relative_l2, 1e-2);
}

// No shared expert, I a multiple of 128 (the "no-shared" preset's 192 is not).
const mok::LayerShape kNoSharedFp8{"no-shared-fp8", 256, 256, 8, 3, 0, "test: fp8 without a shared expert"};

TEST(FusedForwardFp8, KernelFactsAreTheFp8Tables) {
  // No GPU needed: the facts are the tables' constants.
  const mok::world::KernelFacts bf16 = mok::world::fused_kernel_facts(mok::DType::kBF16);
  const mok::world::KernelFacts fp8 = mok::world::fused_kernel_facts(mok::DType::kFP8E4M3);
  EXPECT_EQ(bf16.tile_m, 128);
  EXPECT_EQ(fp8.tile_m, 128);  // the wide 128 x 256 FP8 tiles
  EXPECT_EQ(fp8.token_tile_m, bf16.token_tile_m);  // the shared expert stays bf16
  EXPECT_EQ(fp8.token_tile_m, 128);
  EXPECT_EQ(fp8.max_top_k, bf16.max_top_k);
  EXPECT_EQ(fp8.tensor_maps, bf16.tensor_maps);
  EXPECT_EQ(fp8.schedule_warps_per_cta, bf16.schedule_warps_per_cta);
}

TEST(FusedForwardFp8, MatchesTheFp8ReferenceOnSmallPresets) {
  MOK_REQUIRE_HOPPER();
  struct Case {
    const mok::LayerShape* shape;
    std::vector<int> tokens;
    RoutingMode routing;
    int minibatch;
    int slots;
  };
  const mok::LayerShape& small = mok::find_shape("small");    // H 256, I 128, shared 128, top-2
  const mok::LayerShape& medium = mok::find_shape("medium");  // H 1024, I 512, shared 512, top-4
  const std::vector<Case> cases = {
      {&small, {300}, RoutingMode::kUniform, 128, 2},              // one rank, the ring wraps often
      {&small, {0, 177}, RoutingMode::kUniform, 128, 2},           // a rank without tokens
      {&small, {1, 250}, RoutingMode::kSkewed, 384, 3},            // uneven, one token
      {&small, {333, 120}, RoutingMode::kSameExperts, 128, 1},     // everything on rank 0, one 128-row slot
      {&medium, {96, 33}, RoutingMode::kSkewed, 384, 2},
      {&medium, {150}, RoutingMode::kUniform, 2048, 4},            // one minibatch holds it all
      {&kNoSharedFp8, {150, 71}, RoutingMode::kUniform, 128, 2},   // no shared expert
  };
  uint64_t seed = 101;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.shape->name << " R=" << c.tokens.size() << " T0=" << c.tokens[0]
                                    << " minibatch=" << c.minibatch << " slots=" << c.slots);
    const auto config = fp8_config(*c.shape, c.tokens);
    const auto layer = mok::synthetic::make_layer(config, ++seed, c.routing);  // fresh data each case
    Fp8Device device(layer);
    expect_close_to_reference(run_fused(device, config, small_ring(c.minibatch, c.slots)), reference_out(layer));
  }
}

TEST(FusedForwardFp8, IsTheFp8RecipeNotTheBf16Layer) {
  MOK_REQUIRE_HOPPER();
  // The same inputs: the FP8 result is far closer to the FP8 reference than
  // to the bf16 one (which the recipe misses by ~3e-2, its quantization).
  const auto config = fp8_config("medium", {128, 64});
  const auto layer = mok::synthetic::make_layer(config, 77);
  Fp8Device device(layer);
  const std::vector<uint16_t> out = run_fused(device, config, small_ring(128, 2));
  auto bf16_layer = layer;
  bf16_layer.config.dtype = mok::DType::kBF16;
  const double to_fp8 = mok::relative_l2_error(out, {reference_out(layer)});
  const double to_bf16 = mok::relative_l2_error(out, {reference_out(bf16_layer)});
  std::printf("[ info ] relative L2 to the FP8 reference %.2e, to the bf16 reference %.2e\n", to_fp8, to_bf16);
  EXPECT_LT(to_fp8, 0.25 * to_bf16);
  EXPECT_GT(to_bf16, 5e-3) << "the routed experts do not look quantized";
}

TEST(FusedForwardFp8, BitwiseIdenticalOverRepeatedRuns) {
  MOK_REQUIRE_HOPPER();
  const auto config = fp8_config("medium", {128, 97});
  const auto layer = mok::synthetic::make_layer(config, 9, RoutingMode::kSkewed);
  Fp8Device device(layer);
  mok::FusedForward forward(config, small_ring(128, 2));
  std::vector<uint16_t> first;
  for (int run = 0; run < 10; ++run) {
    device.device.poison_outputs();
    forward.run(device.tensors());
    forward.check();
    const auto out = device.device.download_outputs();
    if (run == 0) first = out;
    ASSERT_EQ(out, first) << "run " << run;
  }
}

TEST(FusedForwardFp8, BitwiseIdenticalAcrossWorldSizesRingsMinibatchesAndSmSplits) {
  MOK_REQUIRE_HOPPER();
  // One global batch of 256 tokens, split over R ranks: each row's x and h
  // scales depend only on the row, so the concatenated output must not
  // change by a single bit.
  const int global_tokens = 256;
  std::vector<uint16_t> baseline;
  struct Case { int world; int minibatch; int slots; int ctas; int comm; };
  for (const Case& c : {Case{1, 2048, 4, 0, 0}, Case{1, 128, 1, 20, 3}, Case{2, 256, 2, 0, 0},
                        Case{2, 128, 3, 30, 2}, Case{4, 384, 2, 0, 0}, Case{4, 128, 3, 16, 1}}) {
    SCOPED_TRACE(testing::Message() << "R=" << c.world << " minibatch=" << c.minibatch << " slots=" << c.slots
                                    << " ctas=" << c.ctas << " comm=" << c.comm);
    const auto config =
        mok::make_config(mok::find_shape("medium"), c.world, global_tokens / c.world, mok::DType::kFP8E4M3);
    const auto layer = mok::synthetic::make_layer(config, 21);
    Fp8Device device(layer);
    mok::FusedForwardOptions o = small_ring(c.minibatch, c.slots);
    o.ctas_per_rank = c.ctas;
    o.comm_ctas_per_rank = c.comm;
    const auto out = run_fused(device, config, o);
    if (baseline.empty()) {
      baseline = out;
      expect_close_to_reference(out, reference_out(layer));
    } else {
      ASSERT_EQ(out, baseline);
    }
  }
}

TEST(FusedForwardFp8, DeviceOrderedPassesGiveTheHostOrderedBits) {
  MOK_REQUIRE_HOPPER();
  const auto config = fp8_config("small", {200, 90});
  const auto layer = mok::synthetic::make_layer(config, 13, RoutingMode::kSkewed);
  Fp8Device device(layer);
  const std::vector<uint16_t> want = run_fused(device, config, small_ring(128, 2));
  mok::FusedForwardOptions ordered = small_ring(128, 2);
  ordered.device_ordered = true;
  mok::FusedForward forward(config, ordered);
  for (int pass = 0; pass < 3; ++pass) {  // both counter sets, and one reused
    device.device.poison_outputs();
    forward.run(device.tensors());
    forward.check();
    EXPECT_EQ(device.device.download_outputs(), want) << "pass " << pass;
  }
}

TEST(FusedForwardFp8, ACapacityObjectGivesTheExactObjectsBits) {
  MOK_REQUIRE_HOPPER();
  const auto capacity = fp8_config("small", {40, 7, 300, 300});
  mok::FusedForward sized_for_capacity(capacity, small_ring(128, 2));
  for (const std::vector<int>& counts : {std::vector<int>{0, 1, 250, 33}, std::vector<int>{13, 0, 2, 299}}) {
    const auto exact = fp8_config("small", counts);
    const auto layer = mok::synthetic::make_layer(exact, 31, RoutingMode::kSkewed);
    Fp8Device device(layer);
    const std::vector<uint16_t> want = run_fused(device, exact, small_ring(128, 2));
    std::vector<mok::RankTensors> tensors = device.tensors();
    for (size_t r = 0; r < tensors.size(); ++r) tensors[r].tokens = counts[r];
    device.device.poison_outputs();
    sized_for_capacity.run(tensors);
    sized_for_capacity.check();
    EXPECT_EQ(device.device.download_outputs(), want) << "counts " << counts[0] << " " << counts[1] << " "
                                                      << counts[2] << " " << counts[3];
  }
}

// Expects `f` to throw a mok::Error whose text holds every one of `says`.
template <class F>
void expect_error(F&& f, std::initializer_list<const char*> says) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one saying " << *says.begin();
  } catch (const mok::Error& e) {
    for (const char* part : says) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(FusedForwardFp8, RefusesWhatItCannotRunWithClearErrors) {
  MOK_REQUIRE_HOPPER();
  // Shapes: H a multiple of 256, I of 128, minibatches of 128-row tiles.
  const mok::LayerShape h384{"h384", 384, 128, 8, 2, 1, "test: H a multiple of 128, not of 256"};
  expect_error([&] { mok::FusedForward refused(fp8_config(h384, {16, 16}), small_ring(128, 1)); },
               {"hidden = 384", "multiple of 256 for fp8"});
  expect_error([&] { mok::FusedForward refused(fp8_config("no-shared", {16, 16}), small_ring(128, 1)); },
               {"intermediate = 192", "multiple of 128 for fp8"});
  expect_error([&] { mok::FusedForward refused(fp8_config("small", {16, 16}), small_ring(192, 1)); },
               {"minibatch_rows = 192", "multiple of 128"});
  // No fused fp8 backward.
  expect_error([&] { mok::FusedBackward refused(fp8_config("small", {16, 16}), small_ring(128, 1)); },
               {"dtype = fp8-e4m3", "fused backward"});

  const auto config = fp8_config("small", {16, 40});
  const auto layer = mok::synthetic::make_layer(config, 1);
  Fp8Device device(layer);
  mok::FusedForward forward(config, small_ring(128, 2));
  // Missing scales: refused before launch, rank and field named.
  auto tensors = device.tensors();
  tensors[1].w13_scales = nullptr;
  expect_error([&] { forward.run(tensors); }, {"rank 1: w13_scales is null"});
  tensors = device.tensors();
  tensors[0].w2_scales = nullptr;
  expect_error([&] { forward.run(tensors); }, {"rank 0: w2_scales is null"});
  // Training buffers: the FP8 forward has none.
  void* state = nullptr;
  void* preact = nullptr;
  MOK_CUDA_CHECK(cudaMalloc(&state, forward.pass_state_bytes()));
  MOK_CUDA_CHECK(cudaMalloc(&preact, static_cast<size_t>(forward.saved_rows()) * 2 * config.intermediate * 2));
  tensors = device.tensors();
  tensors[0].pass_state = state;
  tensors[0].preact = preact;
  expect_error([&] { forward.run(tensors); }, {"rank 0: preact is given", "no training mode"});
  // A bf16 layer's weights are not an fp8 layer's: the bf16 tensors lack the scales.
  expect_error([&] { forward.run(device.device.tensors()); }, {"w13_scales is null"});
  // After every refusal the object runs a good pass, right.
  device.device.poison_outputs();
  forward.run(device.tensors());
  EXPECT_NO_THROW(forward.check());
  expect_close_to_reference(device.device.download_outputs(), reference_out(layer));
  MOK_CUDA_CHECK(cudaFree(state));
  MOK_CUDA_CHECK(cudaFree(preact));
}

}  // namespace
