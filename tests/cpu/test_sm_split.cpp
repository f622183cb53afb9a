// The default split of a rank's SMs between dispatch and GEMM CTAs: it must
// reproduce the dispatch-CTA counts measured best on an H200 for the three
// EP-8 slices (docs/perf-notes.md, f7), scale with the rank's SMs, and never
// leave a rank without a dispatch or a GEMM CTA.
#include <gtest/gtest.h>

#include "mok/presets.hpp"
#include "plan/sm_split.hpp"

namespace {

int split(const char* preset, int world, int ctas) {
  return mok::plan::default_dispatch_ctas(mok::make_config(mok::find_shape(preset), world, 4096), ctas);
}

TEST(SmSplit, MatchesTheCountsMeasuredBestOnAnH200) {
  EXPECT_EQ(split("deepseek-v3-ep8-slice", 1, 132), 4);  // 3: 0.91x, 5: 0.99x of 4
  EXPECT_EQ(split("glm-4.5-ep8-slice", 1, 132), 5);      // 5-7 within 1%, 1.07x of 4
  EXPECT_EQ(split("qwen3-235b-ep8-slice", 1, 132), 6);   // 1.11-1.16x of 4
}

TEST(SmSplit, ScalesWithTheRanksSms) {
  // Virtual worlds partition one GPU: fewer SMs per rank, fewer dispatch CTAs.
  EXPECT_EQ(split("deepseek-v3-ep8-slice", 2, 66), 2);
  EXPECT_EQ(split("deepseek-v3-ep8-slice", 4, 33), 1);
  EXPECT_EQ(split("deepseek-v3-ep8-slice", 8, 16), 1);
  // Narrower experts need more copying per FLOP.
  EXPECT_GT(split("qwen3-30b", 1, 132), split("qwen3-235b-ep8-slice", 1, 132));
}

TEST(SmSplit, KeepsAtLeastOneCtaOfEachRole) {
  // The narrowest legal layer (I = 64, no shared expert) copies the most per
  // FLOP: about half of the SMs go to the dispatch (x = 0.97), never all.
  const mok::LayerShape narrow{"narrow", 1024, 64, 8, 8, 0, "test"};
  const auto config = mok::make_config(narrow, 1, 4096);
  EXPECT_EQ(mok::plan::default_dispatch_ctas(config, 132), 65);
  EXPECT_EQ(mok::plan::default_dispatch_ctas(config, 3), 2);
  EXPECT_EQ(mok::plan::default_dispatch_ctas(config, 2), 1);
  // One CTA cannot hold both roles; the rule still names one dispatch CTA
  // and leaves the refusal to the caller's check.
  EXPECT_EQ(mok::plan::default_dispatch_ctas(config, 1), 1);
  EXPECT_EQ(split("tiny", 1, 2), 1);
}

}  // namespace
