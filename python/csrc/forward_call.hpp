// The fused forward ops' argument checks (fused_forward, fused_forward_train):
// one place that turns the op's tensors into the layer they describe.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "forward_cache.hpp"
#include "mok/layer_config.hpp"

namespace mok::torch_ops {

// The layer the arguments describe, once they are checked.
struct ForwardCall {
  LayerConfig config;
  ForwardKey key;
  at::Device device = at::kCPU;
  bool has_shared = false;
};

// Every check on the op's arguments that needs no GPU: devices, dtypes,
// shapes, contiguity, alignment (real tensors only), values that must fit an
// int. The library checks the rest (dims multiples of 64, E divisible by R,
// option ranges) when it makes its object.
ForwardCall check_forward_arguments(at::TensorList x, at::TensorList expert_ids, at::TensorList weights,
                                    at::TensorList w13, at::TensorList w2,
                                    const std::optional<at::Tensor>& shared_w13,
                                    const std::optional<at::Tensor>& shared_w2, int64_t num_experts,
                                    at::IntArrayRef tuning);

}  // namespace mok::torch_ops
