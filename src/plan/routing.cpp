#include "mok/routing.hpp"

#include <cmath>
#include <string>

#include "mok/error.hpp"

namespace mok {
namespace {

std::string where(int rank, int token, int slot) {
  return "rank " + std::to_string(rank) + ", token " + std::to_string(token) + ", slot " +
         std::to_string(slot);
}

}  // namespace

void validate_routing(const LayerConfig& config, std::span<const RankRouting> routing,
                      bool check_weights) {
  if (static_cast<int>(routing.size()) != config.world_size) {
    throw Error("routing has " + std::to_string(routing.size()) + " ranks; world_size is " +
                std::to_string(config.world_size));
  }
  const int k = config.top_k;
  for (int r = 0; r < config.world_size; ++r) {
    const RankRouting& rank = routing[static_cast<size_t>(r)];
    if (rank.tokens != config.tokens_per_rank[static_cast<size_t>(r)]) {
      throw Error("rank " + std::to_string(r) + ": routing has " + std::to_string(rank.tokens) +
                  " tokens; tokens_per_rank[" + std::to_string(r) + "] is " +
                  std::to_string(config.tokens_per_rank[static_cast<size_t>(r)]));
    }
    if (rank.tokens == 0) continue;
    if (rank.expert_ids == nullptr) throw Error("rank " + std::to_string(r) + ": expert_ids is null");
    if (check_weights && rank.weights == nullptr) {
      throw Error("rank " + std::to_string(r) + ": routing weights are null");
    }
    for (int t = 0; t < rank.tokens; ++t) {
      const int32_t* ids = rank.expert_ids + static_cast<int64_t>(t) * k;
      for (int j = 0; j < k; ++j) {
        if (ids[j] < 0 || ids[j] >= config.num_experts) {
          throw Error(where(r, t, j) + ": expert id " + std::to_string(ids[j]) +
                      " is out of range [0, " + std::to_string(config.num_experts) + ")");
        }
        for (int i = 0; i < j; ++i) {
          if (ids[i] == ids[j]) {
            throw Error(where(r, t, j) + ": expert " + std::to_string(ids[j]) +
                        " already appears at slot " + std::to_string(i) + " of this token");
          }
        }
        if (check_weights) {
          const float w = rank.weights[static_cast<int64_t>(t) * k + j];
          if (!std::isfinite(w)) {
            throw Error(where(r, t, j) + ": routing weight " + std::to_string(w) +
                        " is not finite (NaN and infinity are rejected)");
          }
        }
      }
    }
  }
}

}  // namespace mok
