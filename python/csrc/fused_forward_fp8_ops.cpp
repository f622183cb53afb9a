// torch.ops.mok.fused_forward_fp8: the fused FP8 forward (issue 16) over a
// virtual world of R ranks on one GPU, as a PyTorch custom op -- the fused
// forward's op with block-scaled e4m3 routed weights (mok.quantize_weights'
// values and scales). x stays bf16 (the kernel quantizes it as it pulls the
// rows), so does the shared expert and the output. Kernels: CUDA (the pass),
// Meta (shapes only, for fake tensors under torch.compile; the same
// argument checks), CPU (refuses, with a message). Errors follow
// op_errors.hpp; no backward (mok/autograd.py registers one that raises).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "forward_cache.hpp"
#include "forward_call.hpp"
#include "forward_tensors.hpp"
#include "mok/fused_forward.hpp"
#include "op_errors.hpp"

namespace {

using mok::torch_ops::outputs_like;
using mok::torch_ops::at_rank;
using mok::torch_ops::check_shape;
using mok::torch_ops::check_tensor;
using mok::torch_ops::expect;
using mok::torch_ops::num;
using mok::torch_ops::TensorSpec;

constexpr int64_t kScaleBlock = 128;
const TensorSpec kWeightScales{at::kByte, 3};

// The bf16 op's checks with e4m3 routed weights, then their scales: one
// ue8m0 byte per 128 x 128 block, [E/R, 2I / 128, H / 128] and
// [E/R, H / 128, I / 128].
mok::torch_ops::ForwardCall check_fp8_arguments(at::TensorList x, at::TensorList expert_ids, at::TensorList weights,
                                                at::TensorList w13, at::TensorList w13_scales, at::TensorList w2,
                                                at::TensorList w2_scales,
                                                const std::optional<at::Tensor>& shared_w13,
                                                const std::optional<at::Tensor>& shared_w2, int64_t num_experts,
                                                at::IntArrayRef tuning, int64_t token_capacity) {
  auto call = mok::torch_ops::check_forward_arguments(x, expert_ids, weights, w13, w2, shared_w13, shared_w2,
                                                      num_experts, tuning, token_capacity, at::kFloat8_e4m3fn);
  const int64_t R = static_cast<int64_t>(x.size());
  expect(static_cast<int64_t>(w13_scales.size()) == R && static_cast<int64_t>(w2_scales.size()) == R,
         "w13_scales and w2_scales must each hold " + num(R) + " tensors (one per rank)");
  const int64_t H = call.config.hidden, I = call.config.intermediate, El = num_experts / R;
  expect(H % kScaleBlock == 0 && I % kScaleBlock == 0,
         "H = " + num(H) + " and I = " + num(I) + " must be multiples of 128 for FP8 (128 x 128 weight scale "
         "blocks; the fused FP8 forward also needs H a multiple of 256)");
  for (int64_t r = 0; r < R; ++r) {
    const std::string at = at_rank(r);
    check_tensor(w13_scales[r], "w13_scales" + at, kWeightScales, call.device);
    check_tensor(w2_scales[r], "w2_scales" + at, kWeightScales, call.device);
    check_shape(w13_scales[r], "w13_scales" + at, {El, 2 * I / kScaleBlock, H / kScaleBlock},
                "[E/R, 2I / 128, H / 128]");
    check_shape(w2_scales[r], "w2_scales" + at, {El, H / kScaleBlock, I / kScaleBlock}, "[E/R, H / 128, I / 128]");
  }
  return call;
}

std::vector<at::Tensor> fused_forward_fp8_cuda(at::TensorList x, at::TensorList expert_ids, at::TensorList weights,
                                               at::TensorList w13, at::TensorList w13_scales, at::TensorList w2,
                                               at::TensorList w2_scales, const std::optional<at::Tensor>& shared_w13,
                                               const std::optional<at::Tensor>& shared_w2, int64_t num_experts,
                                               at::IntArrayRef tuning, bool check_errors, int64_t token_capacity) {
  const auto call = check_fp8_arguments(x, expert_ids, weights, w13, w13_scales, w2, w2_scales, shared_w13,
                                        shared_w2, num_experts, tuning, token_capacity);
  const c10::cuda::CUDAGuard guard(call.device);
  std::vector<at::Tensor> out = outputs_like(x);
  std::vector<mok::RankTensors> tensors =
      mok::torch_ops::rank_tensor_list(call, x, expert_ids, weights, w13, w2, shared_w13, shared_w2, out);
  for (size_t r = 0; r < tensors.size(); ++r) {
    tensors[r].w13_scales = w13_scales[r].data_ptr();
    tensors[r].w2_scales = w2_scales[r].data_ptr();
  }
  mok::torch_ops::run_cached_forward(call, tensors, check_errors);
  return out;
}

// Fake tensors: the same checks, outputs of the right shape, no work.
std::vector<at::Tensor> fused_forward_fp8_meta(at::TensorList x, at::TensorList expert_ids, at::TensorList weights,
                                               at::TensorList w13, at::TensorList w13_scales, at::TensorList w2,
                                               at::TensorList w2_scales, const std::optional<at::Tensor>& shared_w13,
                                               const std::optional<at::Tensor>& shared_w2, int64_t num_experts,
                                               at::IntArrayRef tuning, bool /*check_errors*/, int64_t token_capacity) {
  check_fp8_arguments(x, expert_ids, weights, w13, w13_scales, w2, w2_scales, shared_w13, shared_w2, num_experts,
                      tuning, token_capacity);
  return outputs_like(x);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
  m.def(
      "fused_forward_fp8(Tensor[] x, Tensor[] expert_ids, Tensor[] weights, Tensor[] w13, Tensor[] w13_scales, "
      "Tensor[] w2, Tensor[] w2_scales, Tensor? shared_w13, Tensor? shared_w2, int num_experts, int[] tuning, "
      "bool check_errors=False, int token_capacity=0) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) { m.impl("fused_forward_fp8", &fused_forward_fp8_cuda); }
TORCH_LIBRARY_IMPL(mok, Meta, m) { m.impl("fused_forward_fp8", &fused_forward_fp8_meta); }
// CPU tensors reach the same checks, which refuse them by name.
TORCH_LIBRARY_IMPL(mok, CPU, m) { m.impl("fused_forward_fp8", &fused_forward_fp8_cuda); }
