#include "mok/synthetic.hpp"

#include <algorithm>
#include <atomic>
#include <numeric>
#include <thread>
#include <utility>

namespace mok::synthetic {
namespace {

// Stream tags: one per kind of data, so that e.g. the shared expert's
// presence never changes the routed weights drawn for the same seed.
enum StreamTag : uint64_t { kTagX = 1, kTagRouting, kTagW13, kTagW2, kTagSharedW13, kTagSharedW2 };

// [R] of [T_r, width] non-zero bf16 values scale * U(-1, 1), drawn in global token order.
std::vector<std::vector<float>> random_per_token(const LayerConfig& config, int width,
                                                        double scale, Rng& rng) {
  std::vector<std::vector<float>> data(config.tokens_per_rank.size());
  for (size_t r = 0; r < data.size(); ++r) {
    data[r].resize(static_cast<size_t>(config.tokens_per_rank[r]) * width);
    for (float& v : data[r]) v = rng.nonzero_bf16(scale);
  }
  return data;
}

}  // namespace

std::vector<float> random_weight_values(int64_t count, double scale, uint64_t seed, uint64_t tag, int threads) {
  std::vector<float> data(static_cast<size_t>(count));
  const int64_t chunks = (count + kWeightChunk - 1) / kWeightChunk;
  // Chunks taken from one counter; each writes only its own values.
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t c = next++; c < chunks; c = next++) {
      Rng rng(seed, tag, static_cast<uint64_t>(c));
      const int64_t end = std::min(count, (c + 1) * kWeightChunk);
      for (int64_t i = c * kWeightChunk; i < end; ++i) data[static_cast<size_t>(i)] = rng.nonzero_bf16(scale);
    }
  };
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const int64_t count_threads = std::min<int64_t>(chunks, threads > 0 ? threads : cores);
  std::vector<std::thread> pool;
  for (int64_t i = 1; i < count_threads; ++i) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return data;
}

// k distinct expert ids for one token, in slot order.
std::vector<int32_t> draw_experts(const LayerConfig& config, RoutingMode mode, Rng& rng) {
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

// Weights ~ U(-1, 1) / sqrt(fan_in), x ~ U(-1, 1), routing weights a random
// positive split of 1 over the k slots; everything non-zero and bf16-exact.
Layer make_layer(const LayerConfig& config, uint64_t seed, RoutingMode mode) {
  const int64_t H = config.hidden;
  const int64_t I = config.intermediate;
  const int64_t E = config.num_experts;
  const int64_t S = config.shared_width();
  const int k = config.top_k;

  Layer layer;
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

  layer.w13 = random_weight_values(E * 2 * I * H, 1.0 / std::sqrt(static_cast<double>(H)), seed, kTagW13);
  layer.w2 = random_weight_values(E * H * I, 1.0 / std::sqrt(static_cast<double>(I)), seed, kTagW2);
  if (S > 0) {
    layer.shared_w13 = random_weight_values(2 * S * H, 1.0 / std::sqrt(static_cast<double>(H)), seed, kTagSharedW13);
    layer.shared_w2 = random_weight_values(H * S, 1.0 / std::sqrt(static_cast<double>(S)), seed, kTagSharedW2);
  }
  return layer;
}

// A random upstream gradient dout: [R] of [T_r, H], U(-1, 1), bf16-exact, in
// global token order (so it splits over ranks like x does).
std::vector<std::vector<float>> random_dout(const LayerConfig& config, uint64_t seed) {
  Rng rng(seed, 0x6a09e667f3bcc908ull);
  return random_per_token(config, config.hidden, 1.0, rng);
}

// Pointer views of per-rank vectors, for reference_backward's dout argument.
std::vector<const float*> rank_pointers(const std::vector<std::vector<float>>& data) {
  std::vector<const float*> pointers;
  for (const std::vector<float>& rank : data) pointers.push_back(rank.data());
  return pointers;
}

}  // namespace mok::synthetic
