// What the fused forward's ops (virtual world and process world) ask of one
// rank's tensors, and how they hand them to the library.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "mok/fused_forward.hpp"
#include "op_checks.hpp"

namespace mok::torch_ops {

// The bf16 operands are read by TMA, hence aligned.
inline const TensorSpec kActivations{at::kBFloat16, 2, /*aligned=*/true};
inline const TensorSpec kExpertIds{at::kInt, 2};
inline const TensorSpec kRoutingWeights{at::kFloat, 2};
inline const TensorSpec kExpertWeights{at::kBFloat16, 3, /*aligned=*/true};
inline const TensorSpec kSharedWeights{at::kBFloat16, 2, /*aligned=*/true};

// One rank's checked tensors as the library takes them; `out` is the output
// the op allocated, the shared expert is used when `has_shared`.
inline RankTensors rank_tensors(const at::Tensor& x, const at::Tensor& expert_ids, const at::Tensor& weights,
                                const at::Tensor& w13, const at::Tensor& w2,
                                const std::optional<at::Tensor>& shared_w13,
                                const std::optional<at::Tensor>& shared_w2, bool has_shared, at::Tensor& out) {
  RankTensors t;
  t.x = x.data_ptr();
  t.expert_ids = expert_ids.data_ptr<int32_t>();
  t.weights = weights.data_ptr<float>();
  t.out = out.data_ptr();
  t.w13 = w13.data_ptr();
  t.w2 = w2.data_ptr();
  t.shared_w13 = has_shared ? shared_w13->data_ptr() : nullptr;
  t.shared_w2 = has_shared ? shared_w2->data_ptr() : nullptr;
  return t;
}

}  // namespace mok::torch_ops
