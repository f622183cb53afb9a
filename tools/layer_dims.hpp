// A preset's layer dims overridden from the command line, for mok_cli and
// mok_cli tune alike (--hidden H --intermediate I --experts E --top-k K
// --shared S), so that either runs any MoE shape, not only the presets'.
// Host-only, so that the CPU tests parse it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "mok/layer_config.hpp"

namespace mok::tools {

struct LayerDims {
  std::optional<int> hidden, intermediate, experts, top_k;
  std::optional<int> shared;  // the shared FFN's width (0: no shared expert)
};

// Whether `flag` is one of the five.
bool is_layer_dim_flag(const std::string& flag);

// Parses `value` into the dim `flag` names (is_layer_dim_flag). Throws
// mok::Error, prefixed by `who`, for a value that is not a whole integer.
void parse_layer_dim(LayerDims& dims, const std::string& who, const std::string& flag, const std::string& value);

// The usage lines of the five flags.
std::string layer_dims_usage();

// Preset `preset` with `dims`: `world` ranks of `tokens_per_rank` tokens each
// (or `per_rank` when not empty), in `dtype`. Throws mok::Error, prefixed by
// `who`, for dims the library refuses or a negative shared width.
LayerConfig config_with_dims(const std::string& who, const std::string& preset, const LayerDims& dims, int world,
                             int tokens_per_rank, const std::vector<int>& per_rank, DType dtype);

// "" when no dim is overridden, else ", with hidden 2048, experts 64" (for logs).
std::string describe_overrides(const LayerDims& dims);

}  // namespace mok::tools
