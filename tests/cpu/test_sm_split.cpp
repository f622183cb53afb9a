// The default split of a rank's SMs between dispatch and GEMM CTAs: it must
// give counts measured best on an H200 (docs/perf-notes.md, f7 and v6), scale
// with the rank's SMs, and never leave a rank without a dispatch or a GEMM
// CTA.
#include <gtest/gtest.h>

#include "mok/presets.hpp"
#include "plan/sm_split.hpp"

namespace {

int split(const char* preset, int world, int ctas) {
  return mok::plan::default_dispatch_ctas(mok::make_config(mok::find_shape(preset), world, 4096), ctas);
}

TEST(SmSplit, MatchesTheCountsMeasuredBestOnAnH200) {
  EXPECT_EQ(split("deepseek-v3-ep8-slice", 1, 132), 4);  // 3: 0.91x, 5: 0.99x, 6: 0.98x of 4
  EXPECT_EQ(split("glm-4.5-ep8-slice", 1, 132), 7);      // 5-7 within 1%, 1.07x of 4
  EXPECT_EQ(split("qwen3-235b-ep8-slice", 1, 132), 9);   // 6-10 within 2%, 1.11-1.16x of 4
  // H 2048: a row costs the dispatch about what a 14 KB one does.
  EXPECT_EQ(split("qwen1.5-moe-a2.7b", 1, 132), 10);  // 1.59x of 3, 1.57x of 7
  EXPECT_EQ(split("qwen3-30b", 1, 132), 30);          // 1.21x of 10 at 20
  EXPECT_EQ(split("mixtral-8x7b", 1, 132), 1);        // 2, 3: within 5%
  EXPECT_EQ(split("llama4-scout-ep2-slice", 1, 132), 1);  // 2: 0.96x, 3: 0.99x
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
  // FLOP: most of the SMs go to the dispatch (6.8 per GEMM CTA), never all.
  const mok::LayerShape narrow{"narrow", 1024, 64, 8, 8, 0, "test"};
  const auto config = mok::make_config(narrow, 1, 4096);
  EXPECT_EQ(mok::plan::default_dispatch_ctas(config, 132), 116);
  EXPECT_EQ(mok::plan::default_dispatch_ctas(config, 3), 2);
  EXPECT_EQ(mok::plan::default_dispatch_ctas(config, 2), 1);
  // One CTA cannot hold both roles; the rule still names one dispatch CTA
  // and leaves the refusal to the caller's check.
  EXPECT_EQ(mok::plan::default_dispatch_ctas(config, 1), 1);
  EXPECT_EQ(split("tiny", 1, 2), 1);
}

}  // namespace
