// The router's decision for one rank's tokens, as the layer receives it.
#pragma once

#include <cstdint>
#include <span>

#include "mok/layer_config.hpp"

namespace mok {

// Views, not owners: [tokens, top_k] row-major, global expert ids.
struct RankRouting {
  const int32_t* expert_ids = nullptr;  // in [0, E), distinct within a token
  const float* weights = nullptr;       // finite; any sign
  int tokens = 0;
};

// Throws mok::Error naming the rank, token and slot of the first bad entry:
// expert id out of range, the same expert twice in one token, a NaN or
// infinite weight; or naming the rank when its token count differs from the
// config or a pointer is missing. `weights` may be null when
// `check_weights` is false (the schedule needs ids only).
void validate_routing(const LayerConfig& config, std::span<const RankRouting> routing,
                      bool check_weights = true);

}  // namespace mok
