#include "mok/presets.hpp"

#include "mok/error.hpp"

namespace mok {

const std::vector<LayerShape>& layer_shapes() {
  // name, hidden, intermediate, routed experts, top-k, shared experts, note
  static const std::vector<LayerShape> shapes = {
      {"deepseek-v3", 7168, 2048, 256, 8, 1, "DeepSeek-V3 / R1"},
      {"kimi-k2", 7168, 2048, 384, 8, 1, "Kimi K2"},
      {"qwen3-235b", 4096, 1536, 128, 8, 0, "Qwen3-235B-A22B"},
      {"qwen3-30b", 2048, 768, 128, 8, 0, "Qwen3-30B-A3B"},
      {"glm-4.5", 5120, 1536, 160, 8, 1, "GLM-4.5"},
      {"deepseek-v4-flash", 4096, 2048, 256, 6, 1, "DeepSeek-V4-Flash"},
      {"deepseek-v4-pro", 7168, 3072, 384, 6, 1, "DeepSeek-V4-Pro"},
      // One H200's share of DeepSeek-V3 at EP 8, run as a world of its own:
      // the per-GPU work the single-GPU benchmarks measure.
      {"deepseek-v3-ep8-slice", 7168, 2048, 32, 8, 1, "DeepSeek-V3, 32 local experts"},
      {"glm-4.5-ep8-slice", 5120, 1536, 20, 8, 1, "GLM-4.5, 20 local experts"},
      {"qwen3-235b-ep8-slice", 4096, 1536, 16, 8, 0, "Qwen3-235B-A22B, 16 local experts"},
      // Few, wide experts (their gate/up blocks run n-tile major:
      // world::forward_n_major_kinds).
      {"mixtral-8x7b", 4096, 14336, 8, 2, 0, "Mixtral-8x7B, the whole layer"},
      {"llama4-scout-ep2-slice", 5120, 8192, 8, 1, 1, "Llama 4 Scout, 8 local experts"},
      // A shared expert four routed ones wide (5632): half the layer's FLOPs;
      // 273 rows an expert at T 4096, so 29% of the routed tiles' rows pad.
      {"qwen1.5-moe-a2.7b", 2048, 1408, 60, 4, 4, "Qwen1.5-MoE-A2.7B, the whole layer"},
      // Test shapes: small enough for the CPU reference.
      {"tiny", 64, 64, 4, 2, 1, "test: smallest legal dims"},
      {"small", 256, 128, 8, 2, 1, "test"},
      {"medium", 1024, 512, 16, 4, 1, "test: GPU-sized but CPU-checkable"},
      {"no-shared", 256, 192, 8, 3, 0, "test: no shared expert, I not a power of two"},
  };
  return shapes;
}

const LayerShape& find_shape(const std::string& name) {
  for (const LayerShape& shape : layer_shapes()) {
    if (name == shape.name) return shape;
  }
  std::string known;
  for (const LayerShape& shape : layer_shapes()) known += std::string(known.empty() ? "" : ", ") + shape.name;
  throw Error("unknown preset '" + name + "'; known presets: " + known);
}

LayerConfig make_config(const LayerShape& shape, std::vector<int> tokens_per_rank, DType dtype) {
  LayerConfig config;
  config.hidden = shape.hidden;
  config.intermediate = shape.intermediate;
  config.num_experts = shape.num_experts;
  config.top_k = shape.top_k;
  config.num_shared_experts = shape.num_shared_experts;
  config.world_size = static_cast<int>(tokens_per_rank.size());
  config.tokens_per_rank = std::move(tokens_per_rank);
  config.dtype = dtype;
  validate(config);
  return config;
}

LayerConfig make_config(const LayerShape& shape, int world_size, int tokens_per_rank, DType dtype) {
  require(world_size >= 1 && world_size <= kMaxWorldSize, "world_size", world_size,
          "must be in [1, 8] (one NVLink node)");
  return make_config(shape, std::vector<int>(static_cast<size_t>(world_size), tokens_per_rank), dtype);
}

}  // namespace mok
