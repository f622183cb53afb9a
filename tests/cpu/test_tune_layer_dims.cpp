// mok_cli's and mok_cli tune's layer dims from the command line
// (tools/layer_dims.hpp): any MoE shape, not only the presets'. (Named
// test_tune_*: it lives in the tools' host library, which the tuner's tests
// need too, and is left out with them where the tools are not built.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "layer_dims.hpp"
#include "mok/error.hpp"

namespace {

using mok::tools::LayerDims;

TEST(LayerDims, TheFiveFlagsOverrideAPresetsDims) {
  for (const char* flag : {"--hidden", "--intermediate", "--experts", "--top-k", "--shared"}) {
    EXPECT_TRUE(mok::tools::is_layer_dim_flag(flag)) << flag;
  }
  EXPECT_FALSE(mok::tools::is_layer_dim_flag("--tokens"));
  EXPECT_FALSE(mok::tools::is_layer_dim_flag("hidden"));

  // OLMoE from Qwen3-30B-A3B's preset: 64 experts of width 1024.
  LayerDims dims;
  mok::tools::parse_layer_dim(dims, "mok_cli", "--experts", "64");
  mok::tools::parse_layer_dim(dims, "mok_cli", "--intermediate", "1024");
  const mok::LayerConfig olmoe =
      mok::tools::config_with_dims("mok_cli", "qwen3-30b", dims, 1, 4096, {}, mok::DType::kBF16);
  // H, I, E, k, shared width.
  EXPECT_EQ((std::vector<int>{olmoe.hidden, olmoe.intermediate, olmoe.num_experts, olmoe.top_k, olmoe.shared_width()}),
            (std::vector<int>{2048, 1024, 64, 8, 0}));
  EXPECT_EQ(olmoe.tokens_per_rank, std::vector<int>{4096});
  EXPECT_EQ(mok::tools::describe_overrides(dims), ", with intermediate 1024, experts 64");
  EXPECT_EQ(mok::tools::describe_overrides(LayerDims{}), "");

  // A shared FFN of its own width; uneven ranks; FP8.
  LayerDims air;
  mok::tools::parse_layer_dim(air, "mok_cli", "--shared", "1408");
  mok::tools::parse_layer_dim(air, "mok_cli", "--intermediate", "1408");
  const mok::LayerConfig uneven =
      mok::tools::config_with_dims("mok_cli", "qwen3-235b-ep8-slice", air, 0, 0, {100, 0}, mok::DType::kFP8E4M3);
  EXPECT_EQ(uneven.shared_width(), 1408);
  EXPECT_EQ(uneven.world_size, 2);
  EXPECT_EQ(uneven.tokens_per_rank, (std::vector<int>{100, 0}));
  EXPECT_EQ(uneven.dtype, mok::DType::kFP8E4M3);

  // --shared 0 drops a preset's shared expert.
  LayerDims none;
  mok::tools::parse_layer_dim(none, "tune", "--shared", "0");
  EXPECT_EQ(mok::tools::config_with_dims("tune", "deepseek-v3-ep8-slice", none, 1, 256, {}, mok::DType::kBF16)
                .shared_width(),
            0);
}

TEST(LayerDims, BadValuesAreRefusedNamingTheToolAndFlag) {
  LayerDims dims;
  const auto message = [&](const std::string& flag, const std::string& value) {
    try {
      mok::tools::parse_layer_dim(dims, "mok_cli", flag, value);
    } catch (const mok::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("--experts", "12abc").find("mok_cli --experts 12abc: expected an integer"), std::string::npos);
  EXPECT_NE(message("--top-k", "").find("expected an integer"), std::string::npos);
  EXPECT_THROW(mok::tools::parse_layer_dim(dims, "tune", "--tokens", "5"), mok::Error);

  LayerDims negative;
  mok::tools::parse_layer_dim(negative, "tune", "--shared", "-1");
  EXPECT_THROW(mok::tools::config_with_dims("tune", "small", negative, 1, 256, {}, mok::DType::kBF16), mok::Error);
  // Dims the library refuses: a width that is not a multiple of 64.
  LayerDims odd;
  mok::tools::parse_layer_dim(odd, "tune", "--hidden", "100");
  EXPECT_THROW(mok::tools::config_with_dims("tune", "small", odd, 1, 256, {}, mok::DType::kBF16), mok::Error);
}

}  // namespace
