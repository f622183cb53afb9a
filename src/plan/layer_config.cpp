#include "mok/layer_config.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "mok/error.hpp"

namespace mok {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "bf16";
    case DType::kFP8E4M3: return "fp8-e4m3";
  }
  return "unknown";
}

int64_t LayerConfig::total_tokens() const {
  return std::accumulate(tokens_per_rank.begin(), tokens_per_rank.end(), int64_t{0});
}

double LayerConfig::forward_flops() const {
  const double per_row_routed = 6.0 * hidden * intermediate;  // gate + up + down, 2 FLOP per MAC
  const double per_row_shared = 6.0 * hidden * shared_width();
  const double tokens = static_cast<double>(total_tokens());
  return tokens * top_k * per_row_routed + tokens * per_row_shared;
}

void validate(const LayerConfig& c) {
  require(c.hidden > 0 && c.hidden % kDimAlignment == 0, "hidden", c.hidden,
          "must be a positive multiple of 64");
  require(c.intermediate > 0 && c.intermediate % kDimAlignment == 0, "intermediate",
          c.intermediate, "must be a positive multiple of 64");
  require(c.world_size >= 1 && c.world_size <= kMaxWorldSize, "world_size", c.world_size,
          "must be in [1, 8] (one NVLink node)");
  require(c.num_experts >= 1, "num_experts", c.num_experts, "must be >= 1");
  require(c.num_experts % c.world_size == 0, "num_experts", c.num_experts,
          ("must be a multiple of world_size = " + std::to_string(c.world_size)).c_str());
  require(c.top_k >= 1 && c.top_k <= c.num_experts, "top_k", c.top_k,
          ("must be in [1, num_experts = " + std::to_string(c.num_experts) + "]").c_str());
  require(c.num_shared_experts >= 0, "num_shared_experts", c.num_shared_experts, "must be >= 0");
  require(c.shared_intermediate >= 0 && c.shared_intermediate % kDimAlignment == 0,
          "shared_intermediate", c.shared_intermediate,
          "must be 0 (same as intermediate) or a positive multiple of 64");
  require(static_cast<int>(c.tokens_per_rank.size()) == c.world_size, "tokens_per_rank.size()",
          c.tokens_per_rank.size(),
          ("must equal world_size = " + std::to_string(c.world_size)).c_str());
  for (int r = 0; r < c.world_size; ++r) {
    const std::string field = "tokens_per_rank[" + std::to_string(r) + "]";
    require(c.tokens_per_rank[r] >= 0, field.c_str(), c.tokens_per_rank[r], "must be >= 0");
    // Row indices and (token, slot) entries are int32 everywhere.
    require(static_cast<int64_t>(c.tokens_per_rank[r]) * c.top_k < (int64_t{1} << 30),
            field.c_str(), c.tokens_per_rank[r], "times top_k must stay below 2^30");
  }
  require(c.total_tokens() * c.top_k < (int64_t{1} << 30), "total tokens", c.total_tokens(),
          "times top_k must stay below 2^30 (int32 row indices)");
  require(c.dtype == DType::kBF16 || c.dtype == DType::kFP8E4M3, "dtype", static_cast<int>(c.dtype),
          "must be bf16 or fp8-e4m3");
}

// Built with std::to_string, not an ostream: this also runs inside the torch
// extension, where formatting an integer through an ostream once crashed
// (docs/perf-notes.md, "torch extension").
std::string describe(const LayerConfig& c) {
  using std::to_string;
  std::string s = "H=" + to_string(c.hidden) + " I=" + to_string(c.intermediate) + " E=" + to_string(c.num_experts) +
                  " top_k=" + to_string(c.top_k) + " shared=" + to_string(c.num_shared_experts) + "x" +
                  to_string(c.shared_width() / std::max(1, c.num_shared_experts)) + " R=" + to_string(c.world_size) +
                  " T=[";
  for (size_t r = 0; r < c.tokens_per_rank.size(); ++r) {
    if (r > 0) s += ',';
    s += to_string(c.tokens_per_rank[r]);
  }
  return s + "] dtype=" + dtype_name(c.dtype);
}

}  // namespace mok
