// The public description of one MoE layer across an expert-parallel world.
//
// A LayerConfig is the problem, never a decision about how to run it: tile
// shapes, SM splits and ring sizes live in the plan, not here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mok {

enum class DType : int {
  kBF16 = 0,     // bf16 operands, fp32 accumulation
  kFP8E4M3 = 1,  // e4m3 routed-expert operands with power-of-two block scales
};

const char* dtype_name(DType dtype);

// Every dimension the library accepts is a multiple of this many elements, so
// that rows are 128-byte aligned in bf16 and every GEMM K-block is whole.
inline constexpr int kDimAlignment = 64;
// Largest expert-parallel world on one NVLink node.
inline constexpr int kMaxWorldSize = 8;

struct LayerConfig {
  int hidden = 0;              // H: model width
  int intermediate = 0;        // I: routed expert FFN width
  int num_experts = 0;         // E: routed experts in the whole world
  int top_k = 0;               // k: experts per token
  int num_shared_experts = 0;  // shared experts, fused into one FFN of width
                               // num_shared_experts * shared_intermediate
  int shared_intermediate = 0; // width of one shared expert; 0 means `intermediate`
  int world_size = 1;          // R: expert-parallel ranks
  std::vector<int> tokens_per_rank;  // T_r for r in [0, R); may differ, may be 0
  DType dtype = DType::kBF16;

  int experts_per_rank() const { return num_experts / world_size; }
  int expert_owner(int expert) const { return expert / experts_per_rank(); }
  int shared_width() const {
    return num_shared_experts * (shared_intermediate > 0 ? shared_intermediate : intermediate);
  }
  int64_t total_tokens() const;
  // Useful FLOPs of one forward pass over the whole world (2 per multiply-add):
  // routed 3 GEMMs per (token, slot), shared 3 GEMMs per token.
  double forward_flops() const;
};

// Throws mok::Error naming the first inconsistent field, its value and what is
// allowed. Called by every entry point before any work.
void validate(const LayerConfig& config);

// One line, for logs and the CLI.
std::string describe(const LayerConfig& config);

}  // namespace mok
