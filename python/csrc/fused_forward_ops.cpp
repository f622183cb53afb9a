// torch.ops.mok.fused_forward: the fused forward megakernel over a virtual
// world of R ranks on one GPU, as a PyTorch custom op. Rank r's tensors are
// entry r of each list. Kernels: CUDA (the pass), Meta (shapes only, for fake
// tensors under torch.compile; the same argument checks), CPU (refuses, with
// a message). Errors follow op_errors.hpp.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "forward_cache.hpp"
#include "forward_tensors.hpp"
#include "mok/fused_forward.hpp"
#include "op_checks.hpp"
#include "op_errors.hpp"
#include "tuning_options.hpp"

namespace {

using mok::torch_ops::check_shape;
using mok::torch_ops::check_tensor;
using mok::torch_ops::checked_int;
using mok::torch_ops::expect;
using mok::torch_ops::num;
using mok::torch_ops::kActivations, mok::torch_ops::kExpertIds, mok::torch_ops::kRoutingWeights,
    mok::torch_ops::kExpertWeights, mok::torch_ops::kSharedWeights;

// The layer the arguments describe, once they are checked.
struct ForwardCall {
  mok::LayerConfig config;
  mok::torch_ops::ForwardKey key;
  at::Device device = at::kCPU;
  bool has_shared = false;
};

// Every check on the op's arguments that needs no GPU: devices, dtypes,
// shapes, contiguity, alignment (real tensors only), values that must fit an
// int. The library checks the rest (dims multiples of 64, E divisible by R,
// option ranges) when it makes its object.
ForwardCall check_arguments(at::TensorList x, at::TensorList expert_ids, at::TensorList weights,
                            at::TensorList w13, at::TensorList w2, const std::optional<at::Tensor>& shared_w13,
                            const std::optional<at::Tensor>& shared_w2, int64_t num_experts,
                            at::IntArrayRef tuning) {
  const int64_t R = static_cast<int64_t>(x.size());
  expect(R >= 1, "x must hold one tensor per rank (got an empty list)");
  expect(static_cast<int64_t>(expert_ids.size()) == R && static_cast<int64_t>(weights.size()) == R &&
             static_cast<int64_t>(w13.size()) == R && static_cast<int64_t>(w2.size()) == R,
         "x, expert_ids, weights, w13 and w2 must each hold " + num(R) + " tensors (one per rank)");
  expect(num_experts >= R && num_experts % R == 0,
         "num_experts = " + num(num_experts) + " must be a positive multiple of the world size R = " + num(R));

  ForwardCall call;
  call.device = x[0].device();
  mok::torch_ops::expect_cuda(call.device, "x[0]");
  check_tensor(x[0], "x[0]", kActivations, call.device);
  check_tensor(expert_ids[0], "expert_ids[0]", kExpertIds, call.device);
  check_tensor(w2[0], "w2[0]", kExpertWeights, call.device);
  const int64_t H = x[0].size(1), k = expert_ids[0].size(1), I = w2[0].size(2), El = num_experts / R;

  mok::LayerConfig& config = call.config;
  config.hidden = checked_int(H, "H (x[0].size(1))");
  config.intermediate = checked_int(I, "I (w2[0].size(2))");
  config.num_experts = checked_int(num_experts, "num_experts");
  config.top_k = checked_int(k, "k (expert_ids[0].size(1))");
  config.world_size = checked_int(R, "the world size (len(x))");

  call.has_shared = shared_w13.has_value() && shared_w13->defined();
  expect(call.has_shared == (shared_w2.has_value() && shared_w2->defined()),
         "give both shared_w13 and shared_w2, or neither");
  if (call.has_shared) {
    check_tensor(*shared_w13, "shared_w13", kSharedWeights, call.device);
    check_tensor(*shared_w2, "shared_w2", kSharedWeights, call.device);
    const int64_t S = shared_w2->size(1);
    check_shape(*shared_w13, "shared_w13", {2 * S, H}, "[2S, H]");
    check_shape(*shared_w2, "shared_w2", {H, S}, "[H, S]");
    config.num_shared_experts = 1;
    config.shared_intermediate = checked_int(S, "S (shared_w2.size(1))");
  }
  for (int64_t r = 0; r < R; ++r) {
    std::string at = "[";  // appended, not "[" + ... + "]": GCC 12 warns falsely (-Wrestrict) on that
    at += num(r);
    at += "]";
    check_tensor(x[r], "x" + at, kActivations, call.device);
    check_tensor(expert_ids[r], "expert_ids" + at, kExpertIds, call.device);
    check_tensor(weights[r], "weights" + at, kRoutingWeights, call.device);
    check_tensor(w13[r], "w13" + at, kExpertWeights, call.device);
    check_tensor(w2[r], "w2" + at, kExpertWeights, call.device);
    const int64_t T = x[r].size(0);
    check_shape(x[r], "x" + at, {T, H}, "[T, H]");
    check_shape(expert_ids[r], "expert_ids" + at, {T, k}, "[T, k]");
    check_shape(weights[r], "weights" + at, {T, k}, "[T, k]");
    check_shape(w13[r], "w13" + at, {El, 2 * I, H}, "[E/R, 2I, H]");
    check_shape(w2[r], "w2" + at, {El, H, I}, "[E/R, H, I]");
    config.tokens_per_rank.push_back(checked_int(T, "T (x" + at + ".size(0))"));
  }

  mok::torch_ops::ForwardKey& key = call.key;
  key.tokens_per_rank = config.tokens_per_rank;
  key.hidden = config.hidden;
  key.intermediate = config.intermediate;
  key.num_experts = config.num_experts;
  key.top_k = config.top_k;
  key.shared_width = config.shared_width();
  key.device = call.device.is_cuda() ? call.device.index() : -1;
  key.tuning = mok::torch_ops::tuning_values(tuning);
  mok::torch_ops::forward_options(key.tuning);  // refuses values that do not fit an int, before launch
  return call;
}

std::vector<at::Tensor> outputs_like(at::TensorList x) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : x) out.push_back(at::empty_like(t));
  return out;
}

std::vector<at::Tensor> fused_forward_cuda(at::TensorList x, at::TensorList expert_ids, at::TensorList weights,
                                           at::TensorList w13, at::TensorList w2,
                                           const std::optional<at::Tensor>& shared_w13,
                                           const std::optional<at::Tensor>& shared_w2, int64_t num_experts,
                                           at::IntArrayRef tuning, bool check_errors) {
  const ForwardCall call =
      check_arguments(x, expert_ids, weights, w13, w2, shared_w13, shared_w2, num_experts, tuning);
  const c10::cuda::CUDAGuard guard(call.device);
  std::vector<at::Tensor> out = outputs_like(x);
  std::vector<mok::RankTensors> tensors;
  for (size_t r = 0; r < x.size(); ++r) {
    tensors.push_back(mok::torch_ops::rank_tensors(x[r], expert_ids[r], weights[r], w13[r], w2[r], shared_w13,
                                                   shared_w2, call.has_shared, out[r]));
  }
  mok::torch_ops::raising_torch_errors([&] {
    auto cached = mok::torch_ops::cached_forward(call.key, call.config);
    auto stream = c10::cuda::getCurrentCUDAStream(call.device.index()).stream();
    const std::lock_guard<std::mutex> lock(cached->mutex);
    cached->forward->run(tensors, stream);
    if (check_errors) cached->forward->check(stream);
  });
  return out;
}

// Fake tensors: the same checks, outputs of the right shape, no work.
std::vector<at::Tensor> fused_forward_meta(at::TensorList x, at::TensorList expert_ids, at::TensorList weights,
                                           at::TensorList w13, at::TensorList w2,
                                           const std::optional<at::Tensor>& shared_w13,
                                           const std::optional<at::Tensor>& shared_w2, int64_t num_experts,
                                           at::IntArrayRef tuning, bool /*check_errors*/) {
  check_arguments(x, expert_ids, weights, w13, w2, shared_w13, shared_w2, num_experts, tuning);
  return outputs_like(x);
}

std::vector<std::string> tuning_option_names() { return mok::torch_ops::tuning_option_names(); }

std::vector<int64_t> forward_cache_info() { return mok::torch_ops::forward_cache_info(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
  m.def(
      "fused_forward(Tensor[] x, Tensor[] expert_ids, Tensor[] weights, Tensor[] w13, Tensor[] w2, "
      "Tensor? shared_w13, Tensor? shared_w2, int num_experts, int[] tuning, bool check_errors=False) -> Tensor[]");
  m.def("tuning_option_names() -> str[]", &tuning_option_names);
  m.def("forward_cache_info() -> int[]", &forward_cache_info);
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) { m.impl("fused_forward", &fused_forward_cuda); }
TORCH_LIBRARY_IMPL(mok, Meta, m) { m.impl("fused_forward", &fused_forward_meta); }
// CPU tensors reach the same checks, which refuse them by name.
TORCH_LIBRARY_IMPL(mok, CPU, m) { m.impl("fused_forward", &fused_forward_cuda); }
