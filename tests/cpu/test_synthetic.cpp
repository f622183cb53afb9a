// The synthetic data's weights: drawn in chunks from streams of their own,
// so the values do not depend on how many host threads draw them, and still
// what every kernel test assumes (non-zero, bf16-exact, within the scale).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "mok/bf16.hpp"
#include "mok/presets.hpp"
#include "mok/synthetic.hpp"

namespace mok {
namespace {

using synthetic::kWeightChunk;
using synthetic::random_weight_values;

TEST(SyntheticWeights, ThreadCountNeverChangesAValue) {
  const int64_t count = 3 * kWeightChunk + kWeightChunk / 3;  // a partial last chunk
  const std::vector<float> one = random_weight_values(count, 0.25, 7, 3, 1);
  for (int threads : {2, 3, 16}) {
    const std::vector<float> many = random_weight_values(count, 0.25, 7, 3, threads);
    ASSERT_EQ(many.size(), one.size());
    EXPECT_EQ(std::memcmp(many.data(), one.data(), one.size() * sizeof(float)), 0) << threads << " threads";
  }
}

TEST(SyntheticWeights, NonZeroBf16ExactAndWithinTheScale) {
  const double scale = 1.0 / std::sqrt(7168.0);
  const std::vector<float> v = random_weight_values(kWeightChunk + 1000, scale, 1, 4, 4);
  int negative = 0;
  for (float x : v) {
    ASSERT_NE(x, 0.0f);
    ASSERT_EQ(round_to_bf16(x), x);
    // |v| in [1/64, 1) times the scale, then rounded to bf16 (8 bits of mantissa).
    ASSERT_LE(std::abs(x), scale * (1.0 + 1.0 / 128));
    ASSERT_GE(std::abs(x), scale / 64 * (1.0 - 1.0 / 128));
    negative += x < 0;
  }
  // Both signs, about evenly (a stream stuck on one sign would fail).
  EXPECT_GT(negative, static_cast<int>(v.size()) * 45 / 100);
  EXPECT_LT(negative, static_cast<int>(v.size()) * 55 / 100);
}

TEST(SyntheticWeights, ChunksAndTagsAreIndependentStreams) {
  const std::vector<float> a = random_weight_values(2 * kWeightChunk, 1.0, 5, 3);
  const std::vector<float> b = random_weight_values(2 * kWeightChunk, 1.0, 5, 4);  // another tag
  const std::vector<float> c = random_weight_values(2 * kWeightChunk, 1.0, 6, 3);  // another seed
  int64_t same_chunks = 0, same_tag = 0, same_seed = 0;
  for (int64_t i = 0; i < kWeightChunk; ++i) {
    same_chunks += a[static_cast<size_t>(i)] == a[static_cast<size_t>(i + kWeightChunk)];
    same_tag += a[static_cast<size_t>(i)] == b[static_cast<size_t>(i)];
    same_seed += a[static_cast<size_t>(i)] == c[static_cast<size_t>(i)];
  }
  // Equal by chance: two independent draws land on the same bf16 value about
  // 1.3 times in 1000 (most of the mass sits on the 2 x 128 values of the top
  // octave); a repeated or shared stream would match everywhere.
  EXPECT_LT(same_chunks, kWeightChunk / 200);
  EXPECT_LT(same_tag, kWeightChunk / 200);
  EXPECT_LT(same_seed, kWeightChunk / 200);
}

TEST(SyntheticWeights, MakeLayerIsTheSameForTheSameSeed) {
  const LayerConfig config = make_config(find_shape("small"), 2, 64);
  const synthetic::Layer a = synthetic::make_layer(config, 11);
  const synthetic::Layer b = synthetic::make_layer(config, 11);
  EXPECT_EQ(a.w13, b.w13);
  EXPECT_EQ(a.w2, b.w2);
  EXPECT_EQ(a.shared_w13, b.shared_w13);
  EXPECT_EQ(a.shared_w2, b.shared_w2);
  EXPECT_NE(a.w13, synthetic::make_layer(config, 12).w13);
}

}  // namespace
}  // namespace mok
