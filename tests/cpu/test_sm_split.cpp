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
  for (int ctas : {2, 3, 5}) {
    const int dispatch = split("qwen3-30b", 1, ctas);
    EXPECT_GE(dispatch, 1) << ctas;
    EXPECT_LE(dispatch, ctas - 1) << ctas;
  }
  EXPECT_EQ(split("tiny", 1, 2), 1);
}

}  // namespace
