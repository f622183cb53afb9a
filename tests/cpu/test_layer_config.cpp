// LayerConfig validation and presets.
#include <gtest/gtest.h>

#include <string>

#include "mok/error.hpp"
#include "mok/layer_config.hpp"
#include "mok/presets.hpp"

namespace {

mok::LayerConfig valid_config() {
  return mok::make_config(mok::find_shape("small"), /*world_size=*/2, /*tokens_per_rank=*/16);
}

// Expects validate() to throw a mok::Error whose message contains every
// fragment (the field name, its value and the rule).
void expect_rejected(const mok::LayerConfig& config, std::initializer_list<const char*> fragments) {
  try {
    mok::validate(config);
    FAIL() << "config was accepted: " << mok::describe(config);
  } catch (const mok::Error& e) {
    const std::string message = e.what();
    for (const char* fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message '" << message << "' lacks '" << fragment << "'";
    }
  }
}

TEST(LayerConfig, EveryPresetIsValidAtEveryWorldSizeItDivides) {
  for (const mok::LayerShape& shape : mok::layer_shapes()) {
    for (int world : {1, 2, 4, 8}) {
      if (shape.num_experts % world != 0) continue;
      EXPECT_NO_THROW(mok::make_config(shape, world, 128)) << shape.name << " R=" << world;
    }
  }
}

TEST(LayerConfig, AnchorShapesArePresent) {
  const mok::LayerShape& dsv3 = mok::find_shape("deepseek-v3");
  EXPECT_EQ(dsv3.hidden, 7168);
  EXPECT_EQ(dsv3.intermediate, 2048);
  EXPECT_EQ(dsv3.num_experts, 256);
  EXPECT_EQ(dsv3.top_k, 8);
  EXPECT_EQ(dsv3.num_shared_experts, 1);
  for (const char* name : {"kimi-k2", "qwen3-235b", "qwen3-30b", "glm-4.5", "deepseek-v4-flash",
                           "deepseek-v4-pro"}) {
    EXPECT_NO_THROW(mok::find_shape(name)) << name;
  }
}

TEST(LayerConfig, UnknownPresetListsTheKnownOnes) {
  try {
    mok::find_shape("gpt-5");
    FAIL();
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("deepseek-v3"), std::string::npos) << e.what();
  }
}

TEST(LayerConfig, RejectsEachInconsistentField) {
  auto c = valid_config();
  c.hidden = 100;
  expect_rejected(c, {"hidden", "100", "multiple of 64"});
  c = valid_config();
  c.intermediate = 0;
  expect_rejected(c, {"intermediate", "0"});
  c = valid_config();
  c.world_size = 9;
  c.tokens_per_rank.assign(9, 4);
  expect_rejected(c, {"world_size", "9", "[1, 8]"});
  c = valid_config();
  c.num_experts = 7;  // not divisible by R = 2
  expect_rejected(c, {"num_experts", "7", "multiple of world_size = 2"});
  c = valid_config();
  c.top_k = 9;
  expect_rejected(c, {"top_k", "9", "num_experts = 8"});
  c = valid_config();
  c.top_k = 0;
  expect_rejected(c, {"top_k", "0"});
  c = valid_config();
  c.num_shared_experts = -1;
  expect_rejected(c, {"num_shared_experts", "-1"});
  c = valid_config();
  c.shared_intermediate = 96;
  expect_rejected(c, {"shared_intermediate", "96"});
  c = valid_config();
  c.tokens_per_rank = {16};
  expect_rejected(c, {"tokens_per_rank.size()", "1", "world_size = 2"});
  c = valid_config();
  c.tokens_per_rank[1] = -3;
  expect_rejected(c, {"tokens_per_rank[1]", "-3", ">= 0"});
}

TEST(LayerConfig, UnevenAndEmptyRanksAreValid) {
  auto c = mok::make_config(mok::find_shape("small"), std::vector<int>{0, 1, 37, 5});
  EXPECT_EQ(c.total_tokens(), 43);
  EXPECT_EQ(c.experts_per_rank(), 2);
  EXPECT_EQ(c.expert_owner(5), 2);
}

TEST(LayerConfig, ForwardFlopsCountRoutedAndShared) {
  auto c = mok::make_config(mok::find_shape("deepseek-v3-ep8-slice"), 1, 4096);
  // 6 * (T + T*k) * H * I with one shared expert of width I (the MoK count).
  const double expected = 6.0 * (4096.0 + 4096.0 * 8) * 7168.0 * 2048.0;
  EXPECT_DOUBLE_EQ(c.forward_flops(), expected);
}

}  // namespace

TEST(LayerConfig, DescribeListsEveryRanksTokens) {
  mok::LayerConfig config = mok::make_config(mok::find_shape("small"), 2, 300);
  config.tokens_per_rank = {300, 0};
  const std::string text = mok::describe(config);
  EXPECT_NE(text.find("T=[300,0]"), std::string::npos) << text;
  EXPECT_NE(text.find("R=2"), std::string::npos) << text;
}
