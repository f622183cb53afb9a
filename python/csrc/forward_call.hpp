// The fused forward ops' argument checks (fused_forward, fused_forward_train):
// one place that turns the op's tensors into the layer they describe.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "forward_cache.hpp"
#include "mok/fused_forward.hpp"
#include "mok/layer_config.hpp"

namespace mok::torch_ops {

// The layer the arguments describe, once they are checked.
struct ForwardCall {
  LayerConfig config;     // its tokens_per_rank: the capacity of the object that runs the call
  std::vector<int> tokens;  // this call's tokens per rank (RankTensors::tokens), at most the capacity
  ForwardKey key;
  at::Device device = at::kCPU;
  bool has_shared = false;
};

// Every check on the op's arguments that needs no GPU: devices, dtypes,
// shapes, contiguity, alignment (real tensors only), values that must fit an
// int. The library checks the rest (dims multiples of 64, E divisible by R,
// option ranges) when it makes its object. `expert_dtype`: the routed
// weights' (bf16; float8_e4m3fn for the FP8 forward, whose layer is then an
// fp8 one -- its scales are checked by fused_forward_fp8_ops.cpp).
// `token_capacity` > 0: every rank's token count must be at most it, and the
// call runs on the object made for exactly that many tokens per rank (one
// workspace for every count up to it: no allocation when counts change,
// FusedForward's RankTensors::tokens; the same bits); 0: the call's own
// counts, or MOK_TOKEN_BUCKET's rounding of them.
ForwardCall check_forward_arguments(at::TensorList x, at::TensorList expert_ids, at::TensorList weights,
                                    at::TensorList w13, at::TensorList w2,
                                    const std::optional<at::Tensor>& shared_w13,
                                    const std::optional<at::Tensor>& shared_w2, int64_t num_experts,
                                    at::IntArrayRef tuning, int64_t token_capacity,
                                    at::ScalarType expert_dtype = at::kBFloat16);

// The token counts an op's object is made for: every rank's count in
// `tokens` when token_capacity is 0, else token_capacity for every rank
// (refusing a count above it, naming the rank, and a negative capacity).
std::vector<int> capacity_counts(const std::vector<int>& tokens, int64_t token_capacity);

// One output per rank, shaped and typed as that rank's x (uninitialized).
std::vector<at::Tensor> outputs_like(at::TensorList x);

// The library's per-rank tensors of a checked call (RankTensors::tokens set
// to this call's counts), writing to `out`.
std::vector<RankTensors> rank_tensor_list(const ForwardCall& call, at::TensorList x, at::TensorList expert_ids,
                                          at::TensorList weights, at::TensorList w13, at::TensorList w2,
                                          const std::optional<at::Tensor>& shared_w13,
                                          const std::optional<at::Tensor>& shared_w2, std::vector<at::Tensor>& out);

// Runs the call's cached FusedForward on `tensors` on the current stream
// (one pass at a time per object); check_errors synchronises and raises on a
// stalled pass or a bad routing entry.
void run_cached_forward(const ForwardCall& call, const std::vector<RankTensors>& tensors, bool check_errors);

// MOK_TOKEN_BUCKET: 0 or unset (default), each distinct token count gets its
// own object (and workspace); N > 0, a rank's count rounded up to a multiple
// of N is the object's capacity, so calls whose counts vary inside a bucket
// reuse one workspace (FusedForward's RankTensors::tokens; the same bits).
// The ops' token_capacity argument, when given, takes precedence.
int token_bucket();

}  // namespace mok::torch_ops
