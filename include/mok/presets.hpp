// Named layer shapes: per-GPU slices of released models' MoE layers and
// small shapes for tests. A preset fixes the model; the world size and the
// tokens per rank are chosen by whoever runs it.
#pragma once

#include <string>
#include <vector>

#include "mok/layer_config.hpp"

namespace mok {

struct LayerShape {
  const char* name;
  int hidden;
  int intermediate;
  int num_experts;
  int top_k;
  int num_shared_experts;
  const char* note;
};

// All presets, production models first, then test shapes.
const std::vector<LayerShape>& layer_shapes();

// Throws mok::Error listing the known names when `name` is unknown.
const LayerShape& find_shape(const std::string& name);

// A config of `shape` over `world_size` ranks, each with `tokens_per_rank` tokens.
LayerConfig make_config(const LayerShape& shape, int world_size, int tokens_per_rank,
                        DType dtype = DType::kBF16);
// The same with a different token count on every rank.
LayerConfig make_config(const LayerShape& shape, std::vector<int> tokens_per_rank,
                        DType dtype = DType::kBF16);

}  // namespace mok
