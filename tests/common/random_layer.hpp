// Random test layers for the CPU and GPU suites: owned host data for one MoE
// layer (x, routing, weights), deterministic per seed.
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
#pragma once

#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "mok/bf16.hpp"
#include "mok/layer_config.hpp"
#include "mok/reference.hpp"
#include "mok/routing.hpp"

namespace mok::test {

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

// Stream tags: one per kind of data, so that e.g. the shared expert's
// presence never changes the routed weights drawn for the same seed.
enum StreamTag : uint64_t { kTagX = 1, kTagRouting, kTagW13, kTagW2, kTagSharedW13, kTagSharedW2 };

// [R] of [T_r, width] non-zero bf16 values scale * U(-1, 1), drawn in global token order.
inline std::vector<std::vector<float>> random_per_token(const LayerConfig& config, int width,
                                                        double scale, Rng& rng) {
  std::vector<std::vector<float>> data(config.tokens_per_rank.size());
  for (size_t r = 0; r < data.size(); ++r) {
    data[r].resize(static_cast<size_t>(config.tokens_per_rank[r]) * width);
    for (float& v : data[r]) v = rng.nonzero_bf16(scale);
  }
  return data;
}

inline std::vector<float> random_matrix(int64_t count, double scale, Rng& rng) {
  std::vector<float> data(static_cast<size_t>(count));
  for (float& v : data) v = rng.nonzero_bf16(scale);
  return data;
}

// k distinct expert ids for one token, in slot order.
inline std::vector<int32_t> draw_experts(const LayerConfig& config, RoutingMode mode, Rng& rng) {
  const int E = config.num_experts;
  const int k = config.top_k;
  std::vector<int32_t> ids;
  if (mode == RoutingMode::kSameExperts) {
    ids.resize(static_cast<size_t>(k));
    std::iota(ids.begin(), ids.end(), 0);
    for (int j = k - 1; j > 0; --j) std::swap(ids[j], ids[rng.below(j + 1)]);  // Fisher-Yates
    return ids;
  }
  // Sequential draws without replacement; kUniform weighs experts equally.
  std::vector<double> weight(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) weight[e] = mode == RoutingMode::kSkewed ? 1.0 / (e + 1) : 1.0;
  while (static_cast<int>(ids.size()) < k) {
    const double total = std::accumulate(weight.begin(), weight.end(), 0.0);
    double pick = rng.uniform() * total;
    int chosen = -1;
    for (int e = 0; e < E; ++e) {
      if (weight[e] == 0.0) continue;  // taken already
      chosen = e;  // if rounding runs past the end, the last free expert
      if (pick < weight[e]) break;
      pick -= weight[e];
    }
    ids.push_back(chosen);
    weight[chosen] = 0.0;
  }
  return ids;
}

// Owned host data of one layer. Views for the library: inputs(), routing().
struct RandomLayer {
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
inline RandomLayer make_random_layer(const LayerConfig& config, uint64_t seed,
                                     RoutingMode mode = RoutingMode::kUniform) {
  const int64_t H = config.hidden;
  const int64_t I = config.intermediate;
  const int64_t E = config.num_experts;
  const int64_t S = config.shared_width();
  const int k = config.top_k;

  RandomLayer layer;
  layer.config = config;
  Rng x_rng(seed, kTagX);
  layer.x = random_per_token(config, config.hidden, 1.0, x_rng);

  Rng routing_rng(seed, kTagRouting);
  layer.expert_ids.resize(config.tokens_per_rank.size());
  layer.weights.resize(config.tokens_per_rank.size());
  for (size_t r = 0; r < config.tokens_per_rank.size(); ++r) {
    for (int t = 0; t < config.tokens_per_rank[r]; ++t) {
      const std::vector<int32_t> ids = draw_experts(config, mode, routing_rng);
      layer.expert_ids[r].insert(layer.expert_ids[r].end(), ids.begin(), ids.end());
      std::vector<double> raw(static_cast<size_t>(k));
      for (double& v : raw) v = routing_rng.uniform(0.1, 1.0);
      const double total = std::accumulate(raw.begin(), raw.end(), 0.0);
      for (double v : raw) layer.weights[r].push_back(round_to_bf16(static_cast<float>(v / total)));
    }
  }

  Rng w13_rng(seed, kTagW13), w2_rng(seed, kTagW2);
  layer.w13 = random_matrix(E * 2 * I * H, 1.0 / std::sqrt(static_cast<double>(H)), w13_rng);
  layer.w2 = random_matrix(E * H * I, 1.0 / std::sqrt(static_cast<double>(I)), w2_rng);
  if (S > 0) {
    Rng s13_rng(seed, kTagSharedW13), s2_rng(seed, kTagSharedW2);
    layer.shared_w13 = random_matrix(2 * S * H, 1.0 / std::sqrt(static_cast<double>(H)), s13_rng);
    layer.shared_w2 = random_matrix(H * S, 1.0 / std::sqrt(static_cast<double>(S)), s2_rng);
  }
  return layer;
}

// A random upstream gradient dout: [R] of [T_r, H], U(-1, 1), bf16-exact, in
// global token order (so it splits over ranks like x does).
inline std::vector<std::vector<float>> random_dout(const LayerConfig& config, uint64_t seed) {
  Rng rng(seed, 0x6a09e667f3bcc908ull);
  return random_per_token(config, config.hidden, 1.0, rng);
}

// Pointer views of per-rank vectors, for reference_backward's dout argument.
inline std::vector<const float*> rank_pointers(const std::vector<std::vector<float>>& data) {
  std::vector<const float*> pointers;
  for (const std::vector<float>& rank : data) pointers.push_back(rank.data());
  return pointers;
}

}  // namespace mok::test
