// torch.ops.mok.fused_forward: the fused forward megakernel over a virtual
// world of R ranks on one GPU, as a PyTorch custom op. Rank r's tensors are
// entry r of each list. Kernels: CUDA (the pass), Meta (shapes only, for fake
// tensors under torch.compile; the same argument checks), CPU (refuses, with
// a message). Errors follow op_errors.hpp.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "forward_cache.hpp"
#include "forward_call.hpp"
#include "forward_tensors.hpp"
#include "mok/fused_forward.hpp"
#include "op_errors.hpp"
#include "plan/sm_split.hpp"
#include "tuning_options.hpp"

namespace {

using mok::torch_ops::outputs_like;
using mok::torch_ops::check_forward_arguments;

std::vector<at::Tensor> fused_forward_cuda(at::TensorList x, at::TensorList expert_ids, at::TensorList weights,
                                           at::TensorList w13, at::TensorList w2,
                                           const std::optional<at::Tensor>& shared_w13,
                                           const std::optional<at::Tensor>& shared_w2, int64_t num_experts,
                                           at::IntArrayRef tuning, bool check_errors, int64_t token_capacity) {
  const auto call = check_forward_arguments(x, expert_ids, weights, w13, w2, shared_w13, shared_w2, num_experts,
                                            tuning, token_capacity);
  const c10::cuda::CUDAGuard guard(call.device);
  std::vector<at::Tensor> out = outputs_like(x);
  const std::vector<mok::RankTensors> tensors =
      mok::torch_ops::rank_tensor_list(call, x, expert_ids, weights, w13, w2, shared_w13, shared_w2, out);
  mok::torch_ops::run_cached_forward(call, tensors, check_errors);
  return out;
}

// Fake tensors: the same checks, outputs of the right shape, no work.
std::vector<at::Tensor> fused_forward_meta(at::TensorList x, at::TensorList expert_ids, at::TensorList weights,
                                           at::TensorList w13, at::TensorList w2,
                                           const std::optional<at::Tensor>& shared_w13,
                                           const std::optional<at::Tensor>& shared_w2, int64_t num_experts,
                                           at::IntArrayRef tuning, bool /*check_errors*/, int64_t token_capacity) {
  check_forward_arguments(x, expert_ids, weights, w13, w2, shared_w13, shared_w2, num_experts, tuning,
                          token_capacity);
  return outputs_like(x);
}

std::vector<std::string> tuning_option_names() { return mok::torch_ops::tuning_option_names(); }

std::vector<int64_t> forward_cache_info() { return mok::torch_ops::forward_cache_info(); }

// The dispatch CTAs per rank the library picks for a layer when the caller
// leaves comm_ctas_per_rank at 0 (plan/sm_split.hpp): the value python -m
// mok.tune scales by the grid's factors (python/mok/tuning_grid.txt).
// Host-only arithmetic; no GPU needed.
int64_t default_comm_ctas_per_rank(int64_t hidden, int64_t intermediate, int64_t experts, int64_t top_k,
                                   int64_t shared, int64_t tokens_per_rank, int64_t world, int64_t ctas_per_rank,
                                   bool fp8) {
  return mok::torch_ops::raising_torch_errors([&] {
    mok::LayerConfig config;
    config.hidden = static_cast<int>(hidden);
    config.intermediate = static_cast<int>(intermediate);
    config.num_experts = static_cast<int>(experts);
    config.top_k = static_cast<int>(top_k);
    config.num_shared_experts = shared > 0 ? 1 : 0;
    config.shared_intermediate = static_cast<int>(shared);
    config.world_size = static_cast<int>(world);
    config.tokens_per_rank.assign(static_cast<size_t>(std::max<int64_t>(world, 0)), static_cast<int>(tokens_per_rank));
    config.dtype = fp8 ? mok::DType::kFP8E4M3 : mok::DType::kBF16;
    mok::validate(config);
    mok::torch_ops::expect(ctas_per_rank >= 2, "ctas_per_rank " + mok::torch_ops::num(ctas_per_rank) +
                                                   " must be >= 2 (a dispatch CTA and a GEMM CTA)");
    return static_cast<int64_t>(mok::plan::default_dispatch_ctas(config, static_cast<int>(ctas_per_rank)));
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
  m.def(
      "fused_forward(Tensor[] x, Tensor[] expert_ids, Tensor[] weights, Tensor[] w13, Tensor[] w2, "
      "Tensor? shared_w13, Tensor? shared_w2, int num_experts, int[] tuning, bool check_errors=False, "
      "int token_capacity=0) -> Tensor[]");
  m.def("tuning_option_names() -> str[]", &tuning_option_names);
  m.def("forward_cache_info() -> int[]", &forward_cache_info);
  m.def(
      "default_comm_ctas_per_rank(int hidden, int intermediate, int experts, int top_k, int shared, "
      "int tokens_per_rank, int world, int ctas_per_rank, bool fp8=False) -> int",
      &default_comm_ctas_per_rank);
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) { m.impl("fused_forward", &fused_forward_cuda); }
TORCH_LIBRARY_IMPL(mok, Meta, m) { m.impl("fused_forward", &fused_forward_meta); }
// CPU tensors reach the same checks, which refuse them by name.
TORCH_LIBRARY_IMPL(mok, CPU, m) { m.impl("fused_forward", &fused_forward_cuda); }
