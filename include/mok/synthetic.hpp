// Synthetic layers for tests, benchmarks and the CLI: owned host data for one
// MoE layer (x, routing, weights), deterministic per seed.
//
// Values come from std::mt19937_64 through our own integer-to-real mapping
// (the std:: distributions differ between standard libraries), so a seed
// means the same data on every machine. Every value is non-zero and rounded
// to bf16, so that a float copy is exactly what a bf16 kernel reads.
//
// Per-token data (x, routing) is drawn in global token order (rank ascending,
// token ascending) from streams of its own: the same seed, experts and total
// token count give the same global batch however it is split over ranks, which
// is what the EP-invariance tests compare.
//
// Weights are drawn in chunks of kWeightChunk values, chunk c from a stream
// of its own (Rng(seed, tag, c)), on as many host threads as there are cores:
// the same values whatever the thread count. One stream for a whole weight
// drew the DeepSeek-V3 slice's 1.4 G values on one thread, ~20-36 s of every
// GPU benchmark's setup.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "mok/bf16.hpp"
#include "mok/layer_config.hpp"
#include "mok/reference.hpp"
#include "mok/routing.hpp"

namespace mok::synthetic {

enum class RoutingMode {
  kUniform,      // k distinct experts per token, uniformly at random
  kSkewed,       // k distinct experts, Zipf-like: expert e has weight 1 / (e + 1)
  kSameExperts,  // every token picks experts 0..k-1 (slot order shuffled per token):
                 // the most extreme imbalance, all rows on the fewest ranks
};

// One random stream. Streams of different `tag` are independent.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t tag) : engine_(mix(seed) ^ mix(tag + 0x9e3779b97f4a7c15ull)) {}
  // Stream `stream` of the (seed, tag) family: independent of every other.
  Rng(uint64_t seed, uint64_t tag, uint64_t stream)
      : engine_(mix(seed) ^ mix(tag + 0x9e3779b97f4a7c15ull) ^ mix(mix(stream) + 0x632be59bd9b4e019ull)) {}

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n); the modulo bias is below 2^-50 for our n.
  int below(int n) { return static_cast<int>(engine_() % static_cast<uint64_t>(n)); }

  // A non-zero bf16 value: scale * v, v uniform in (-1, -1/64] u [1/64, 1).
  // Keeping |v| >= 1/64 keeps values well away from 0, so adding a small
  // power-of-two step to them (finite differences) is exact in float.
  float nonzero_bf16(double scale) {
    for (;;) {
      const double v = uniform(-1.0, 1.0);
      if (std::abs(v) < 1.0 / 64) continue;
      return round_to_bf16(static_cast<float>(scale * v));
    }
  }

 private:
  // splitmix64 finaliser: spreads nearby seeds over the whole state.
  static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::mt19937_64 engine_;
};

// Owned host data of one layer. Views for the library: inputs(), routing().
struct Layer {
  LayerConfig config;
  std::vector<std::vector<float>> x;            // [R] of [T_r, H]
  std::vector<std::vector<int32_t>> expert_ids;  // [R] of [T_r, k]
  std::vector<std::vector<float>> weights;      // [R] of [T_r, k]: positive, sum ~1 per token
  std::vector<float> w13;                       // [E, 2I, H]
  std::vector<float> w2;                        // [E, H, I]
  std::vector<float> shared_w13;                // [2S, H]; empty when S == 0
  std::vector<float> shared_w2;                 // [H, S]

  std::vector<RankRouting> routing() const {
    std::vector<RankRouting> views(x.size());
    for (size_t r = 0; r < views.size(); ++r) {
      views[r] = {expert_ids[r].data(), weights[r].data(), config.tokens_per_rank[r]};
    }
    return views;
  }

  LayerInputs inputs() const {
    LayerInputs in;
    in.config = config;
    for (const std::vector<float>& rank_x : x) in.x.push_back(rank_x.data());
    in.routing = routing();
    in.w13 = w13.data();
    in.w2 = w2.data();
    in.shared_w13 = shared_w13.empty() ? nullptr : shared_w13.data();
    in.shared_w2 = shared_w2.empty() ? nullptr : shared_w2.data();
    return in;
  }
};

// Weights ~ U(-1, 1) / sqrt(fan_in), x ~ U(-1, 1), routing weights a random
// positive split of 1 over the k slots; everything non-zero and bf16-exact.
Layer make_layer(const LayerConfig& config, uint64_t seed, RoutingMode mode = RoutingMode::kUniform);

// k distinct expert ids for one token, in slot order.
std::vector<int32_t> draw_experts(const LayerConfig& config, RoutingMode mode, Rng& rng);

// `count` non-zero bf16-exact values scale * U(-1, 1) (Rng::nonzero_bf16),
// chunk c of kWeightChunk values drawn from Rng(seed, tag, c), on up to
// `threads` host threads (0: every core): the same values for any thread
// count. make_layer's weights.
inline constexpr int64_t kWeightChunk = int64_t{1} << 20;
std::vector<float> random_weight_values(int64_t count, double scale, uint64_t seed, uint64_t tag, int threads = 0);

// A random upstream gradient dout: [R] of [T_r, H], U(-1, 1), bf16-exact, in
// global token order (so it splits over ranks like x does).
std::vector<std::vector<float>> random_dout(const LayerConfig& config, uint64_t seed);

// Pointer views of per-rank vectors, e.g. for reference_backward's dout.
std::vector<const float*> rank_pointers(const std::vector<std::vector<float>>& data);

}  // namespace mok::synthetic
