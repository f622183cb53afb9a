// The fused forward's option checks and defaults (src/world/forward_options.hpp),
// with no GPU: the GPUs come in as GpuFacts. Every refusal names its field
// and says what is allowed; the ring's size is bounded so that the kernel's
// 32-bit row arithmetic stays exact; an fp8 layer gets the FP8 forward's
// shape rules (and the CPU reference's backward refuses it).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hopper_kernel_facts.hpp"
#include "mok/error.hpp"
#include "mok/presets.hpp"
#include "mok/reference.hpp"
#include "mok/schedule.hpp"
#include "mok/synthetic.hpp"
#include "plan/sm_split.hpp"
#include "world/forward_options.hpp"

namespace {

using mok::world::GpuFacts;
using mok::world::KernelFacts;

KernelFacts hopper_kernel() { return mok::test_support::hopper_kernel_facts(); }

GpuFacts gpus(int count) {
  GpuFacts g;
  g.current_device = 0;
  g.sm_count.assign(static_cast<size_t>(count), 132);
  return g;
}

mok::FusedForwardOptions resolve(const mok::LayerConfig& config, const mok::FusedForwardOptions& options,
                                 int gpu_count = 1) {
  return mok::world::resolve_options(config, options, hopper_kernel(), gpus(gpu_count));
}

// Expects a mok::Error whose text contains every one of `says`.
void expect_refused(const mok::LayerConfig& config, const mok::FusedForwardOptions& options,
                    const std::vector<std::string>& says, int gpu_count = 1) {
  try {
    resolve(config, options, gpu_count);
    ADD_FAILURE() << "accepted; expected an error saying " << says.front();
  } catch (const mok::Error& e) {
    for (const std::string& s : says) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
  }
}

const mok::LayerConfig kSmall = mok::make_config(mok::find_shape("small"), 2, 64);

TEST(ForwardOptions, DefaultsSplitTheGpuBetweenRanksAndFeedTheGemms) {
  const auto o = resolve(kSmall, {});
  EXPECT_EQ(o.ctas_per_rank, 66);  // the virtual world's 2 ranks share one GPU's 132 SMs
  EXPECT_EQ(o.comm_ctas_per_rank, mok::plan::default_dispatch_ctas(kSmall, 66));
  EXPECT_FALSE(o.device_ordered);

  mok::FusedForwardOptions peer;
  peer.devices = {1, 0};
  EXPECT_EQ(resolve(kSmall, peer, 2).ctas_per_rank, 132);  // a whole GPU per rank
  EXPECT_EQ(mok::world::rank_devices(kSmall, peer, gpus(2)), (std::vector<int>{1, 0}));

  mok::FusedForwardOptions process;
  process.process_rank = 1;
  const auto p = resolve(kSmall, process);
  EXPECT_TRUE(p.device_ordered);  // no host orders the processes' GPUs
  EXPECT_EQ(p.ctas_per_rank, 132);
  EXPECT_EQ(mok::world::world_kind(p), mok::world::WorldKind::kProcess);
}

TEST(ForwardOptions, MinibatchRowsAreBoundedForThe32BitRowArithmetic) {
  mok::FusedForwardOptions o;
  o.ring_slots = 1;
  o.minibatch_rows = 100;
  expect_refused(kSmall, o, {"minibatch_rows = 100", "multiple of 128"});
  o.minibatch_rows = mok::world::kMaxMinibatchRows;
  EXPECT_NO_THROW(resolve(kSmall, o));
  o.minibatch_rows = mok::world::kMaxMinibatchRows + 128;
  expect_refused(kSmall, o, {"minibatch_rows = " + std::to_string(o.minibatch_rows), "<= 2^29", "32-bit"});
  o.minibatch_rows = 2'147'483'520;  // the largest multiple of 128 in an int
  expect_refused(kSmall, o, {"minibatch_rows", "<= 2^29"});
}

TEST(ForwardOptions, RingSlotsAreBoundedForThe32BitRingArithmetic) {
  mok::FusedForwardOptions o;
  o.minibatch_rows = 2048;
  o.ring_slots = 0;
  expect_refused(kSmall, o, {"ring_slots = 0", ">= 1"});
  o.ring_slots = (1 << 30) / 2048;  // a ring of exactly 2^30 rows
  EXPECT_NO_THROW(resolve(kSmall, o));
  o.ring_slots += 1;
  expect_refused(kSmall, o, {"ring_slots = " + std::to_string(o.ring_slots), "2^30", "32-bit"});
  o.ring_slots = 1 << 30;  // ring_slots x minibatch_rows would wrap an int
  expect_refused(kSmall, o, {"ring_slots", "2^30"});
}

// The FP8 forward: H a multiple of 256, I of 128 (whole scale blocks in
// every tile), minibatches of 128-row tiles (its facts' tile_m), the ring's
// scale arrays indexable in 32 bits; device-ordered passes as in bf16.
mok::FusedForwardOptions resolve_fp8(const mok::LayerConfig& config, const mok::FusedForwardOptions& options) {
  return mok::world::resolve_options(config, options, mok::test_support::hopper_fp8_kernel_facts(), gpus(1));
}

void expect_fp8_refused(const mok::LayerConfig& config, const mok::FusedForwardOptions& options,
                        const std::vector<std::string>& says) {
  try {
    resolve_fp8(config, options);
    ADD_FAILURE() << "accepted; expected an error saying " << says.front();
  } catch (const mok::Error& e) {
    for (const std::string& s : says) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
  }
}

TEST(ForwardOptions, Fp8LayersGetTheFp8ForwardsShapeRules) {
  auto fp8 = kSmall;  // H 256, I 128, shared 128
  fp8.dtype = mok::DType::kFP8E4M3;
  EXPECT_NO_THROW(mok::validate(fp8));
  EXPECT_NO_THROW(resolve_fp8(fp8, {}));
  mok::FusedForwardOptions o;
  o.minibatch_rows = 128;  // one 128-row FP8 tile
  o.ring_slots = 1;
  EXPECT_NO_THROW(resolve_fp8(fp8, o));
  o.minibatch_rows = 384;
  EXPECT_NO_THROW(resolve_fp8(fp8, o));
  o.minibatch_rows = 192;
  expect_fp8_refused(fp8, o, {"minibatch_rows = 192", "multiple of 128"});
  o = {};
  o.device_ordered = true;
  EXPECT_TRUE(resolve_fp8(fp8, o).device_ordered);

  auto narrow = fp8;
  narrow.hidden = 384;  // a multiple of 128, not of 256
  expect_fp8_refused(narrow, {}, {"hidden = 384", "multiple of 256 for fp8"});
  narrow = fp8;
  narrow.intermediate = 192;
  expect_fp8_refused(narrow, {}, {"intermediate = 192", "multiple of 128 for fp8"});
  auto deep = fp8;  // a down GEMM deeper than the shared-memory table of weight scales
  deep.intermediate = 32768 + 128;
  expect_fp8_refused(deep, {}, {"intermediate = 32896", "intermediate <= 32768"});
  deep.intermediate = 32768;
  EXPECT_NO_THROW(resolve_fp8(deep, {}));
  // The shared expert stays bf16: its width follows the bf16 rules (multiples of 64).
  auto shared = fp8;
  shared.shared_intermediate = 192;
  EXPECT_NO_THROW(resolve_fp8(shared, {}));
  // The same shapes in bf16 are fine.
  narrow.dtype = mok::DType::kBF16;
  EXPECT_NO_THROW(resolve(narrow, {}));

  // The ring's scales are indexed in 32 bits: rows x max(H, I) / 128 < 2^31.
  auto wide = fp8;
  wide.hidden = 8192;  // 64 scale blocks a row
  o = {};
  o.minibatch_rows = 2048;
  o.ring_slots = (1 << 25) / 2048 - 1;
  EXPECT_NO_THROW(resolve_fp8(wide, o));
  o.ring_slots += 1;
  expect_fp8_refused(wide, o, {"ring_slots = " + std::to_string(o.ring_slots), "2^31 for fp8", "32-bit"});
}

TEST(ForwardOptions, TheCpuReferenceComputesAnFp8ForwardOnlyWhereItCan) {
  // The forward implements the FP8 recipe, whose scale blocks need dims that
  // are multiples of 128; the backward does not implement fp8 and says so,
  // rather than pass bf16 math off as an fp8 result.
  auto refused = [](const mok::LayerConfig& config, bool backward, const char* says) {
    const auto layer = mok::synthetic::make_layer(config, 1);
    const auto routing = layer.routing();
    const auto schedule = mok::build_schedule(config, routing, {128, 1});
    try {
      if (backward) {
        std::vector<std::vector<float>> dout(1, std::vector<float>(static_cast<size_t>(8 * config.hidden), 1.0f));
        const std::vector<const float*> views{dout[0].data()};
        (void)mok::reference_backward(layer.inputs(), schedule, views, {});
      } else {
        (void)mok::reference_forward(layer.inputs(), schedule, {});
      }
      ADD_FAILURE() << "no error; expected: " << says;
    } catch (const mok::Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused(mok::make_config(mok::find_shape("tiny"), 1, 8, mok::DType::kFP8E4M3), false,
          "must be a multiple of 128 for fp8");
  refused(mok::make_config(mok::find_shape("small"), 1, 8, mok::DType::kFP8E4M3), true,
          "dtype = fp8-e4m3: not implemented yet in the CPU reference backward");
}

TEST(ForwardOptions, KernelLimitsAndTimeoutsNameTheirField) {
  auto wide = kSmall;
  wide.hidden = 8192 + 64;
  expect_refused(wide, {}, {"hidden = 8256", "hidden <= 8192"});
  mok::FusedForwardOptions o;
  o.timeout_seconds = 9;
  expect_refused(kSmall, o, {"timeout_seconds", "(0, 8]"});
  o = {};
  o.device_ordered = true;
  o.barrier_timeout_seconds = 2;
  o.timeout_seconds = 5;
  expect_refused(kSmall, o, {"barrier_timeout_seconds", "must exceed timeout_seconds"});
  o = {};
  o.lookahead = 0;
  expect_refused(kSmall, o, {"lookahead = 0"});
  o = {};
  o.trace_events = 10;
  o.device_ordered = true;
  expect_refused(kSmall, o, {"trace_events", "host-ordered"});
  o = {};
  o.ctas_per_rank = 100;  // 2 ranks x 100 > 132 SMs
  expect_refused(kSmall, o, {"ctas_per_rank = 100", "132 SMs"});
  o = {};
  o.ctas_per_rank = 10;
  o.comm_ctas_per_rank = 10;
  expect_refused(kSmall, o, {"comm_ctas_per_rank = 10", "at least one GEMM CTA"});
}

TEST(ForwardOptions, WorldsAreCheckedAgainstTheVisibleGpus) {
  mok::FusedForwardOptions o;
  o.process_rank = 2;
  expect_refused(kSmall, o, {"process_rank = 2", "[0, 2)"});
  o.process_rank = 0;
  o.devices = {0, 1};
  expect_refused(kSmall, o, {"must be empty in a process world"}, 2);
  o = {};
  o.devices = {0};
  expect_refused(kSmall, o, {"devices.size() = 1", "equal world_size"}, 2);
  o.devices = {0, 0};
  expect_refused(kSmall, o, {"devices[1] = 0", "one rank per GPU"}, 2);
  o.devices = {0, 2};
  expect_refused(kSmall, o, {"devices[1] = 2", "one of the 2 visible GPUs"}, 2);
}

}  // namespace

// The gate/up blocks run n-tile major only for layers of few, wide experts
// (one expert's W13 beyond half the L2, and an expert's m-tiles times the
// gate/up n-tiles beyond 1.5 times the GEMM CTAs); the presets the forward was
// tuned on keep m-tile major order; with the L2 unknown the rule is off.
TEST(ForwardOptions, TheGateUpBlocksRunNTileMajorForFewWideExpertsOnly) {
  constexpr int32_t kGateUp = 2;  // any index: the rule sets that bit
  const auto n_major = [&](const mok::LayerShape& shape, long long l2_bytes, mok::DType dtype = mok::DType::kBF16) {
    const mok::LayerConfig config = mok::make_config(shape, std::vector<int>{4096}, dtype);
    GpuFacts g = gpus(1);
    if (l2_bytes > 0) g.l2_bytes = {l2_bytes};
    const KernelFacts kernel = dtype == mok::DType::kFP8E4M3 ? mok::test_support::hopper_fp8_kernel_facts()
                                                              : hopper_kernel();
    const auto o = mok::world::resolve_options(config, {}, kernel, g);
    const int32_t gate_up_n_tiles = shape.intermediate / 128;  // 128 h columns a tile
    return mok::world::forward_n_major_kinds(config, o, g, kernel, kGateUp, gate_up_n_tiles);
  };
  constexpr long long kH200L2 = 50ll << 20;
  const mok::LayerShape& mixtral = mok::find_shape("mixtral-8x7b");
  const mok::LayerShape& scout = mok::find_shape("llama4-scout-ep2-slice");
  EXPECT_EQ(n_major(mixtral, kH200L2), 1u << kGateUp);  // W13[e] 235 MB; 8 m-tiles x 112 n-tiles
  EXPECT_EQ(n_major(scout, kH200L2), 1u << kGateUp);    // 168 MB; 4 x 64
  EXPECT_EQ(n_major(mixtral, 0), 0u);                   // L2 not known: the table's order
  EXPECT_EQ(n_major(mixtral, 1ll << 40), 0u);           // an L2 that holds every W13[e]
  for (const char* tuned : {"deepseek-v3-ep8-slice", "glm-4.5-ep8-slice", "qwen3-235b-ep8-slice"}) {
    EXPECT_EQ(n_major(mok::find_shape(tuned), kH200L2), 0u) << tuned;
    EXPECT_EQ(n_major(mok::find_shape(tuned), kH200L2, mok::DType::kFP8E4M3), 0u) << tuned << " fp8";
  }
  // FP8 halves W13's bytes: an expert of 40 MB in bf16 (beyond half the L2)
  // is 20 MB in FP8 (within it).
  const mok::LayerShape narrow{"narrow", 5120, 2048, 2, 2, 0, "test"};
  EXPECT_EQ(n_major(narrow, kH200L2), 1u << kGateUp);
  EXPECT_EQ(n_major(narrow, kH200L2, mok::DType::kFP8E4M3), 0u);
}
