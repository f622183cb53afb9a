// torch.ops.mok.fused_forward: the fused forward megakernel over a virtual
// world of R ranks on one GPU, as a PyTorch custom op. Rank r's tensors are
// entry r of each list. A FusedForward (workspace and all) is cached per
// (config, options) on first use.
//
// Errors: the op throws no C++ exception across the dispatcher. On bad input
// (or, with check_errors, a failed pass) it returns an empty list and leaves
// the message for torch.ops.mok.last_error(); python/mok raises it as a
// Python exception. (A c10::Error thrown from this library crashed the
// process under torch 2.11 on the device machine; see grouped_mm_ops.cpp.)
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "mok/error.hpp"
#include "mok/fused_forward.hpp"
#include "op_checks.hpp"

namespace {

using mok::torch_ops::expect;
using mok::torch_ops::num;

std::string& last_error_message() {
  thread_local std::string message;
  return message;
}

void check(const at::Tensor& t, const std::string& name, at::ScalarType dtype, int64_t dim, const at::Device& device) {
  mok::torch_ops::check_tensor(t, name, dtype, dim, device);
}

using CacheKey = std::tuple<std::vector<int>, int, int, int, int, int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

mok::FusedForward& cached_forward(const mok::LayerConfig& config, const mok::FusedForwardOptions& options) {
  static std::mutex mutex;
  static std::map<CacheKey, std::unique_ptr<mok::FusedForward>> cache;
  int device = 0;
  cudaGetDevice(&device);
  const CacheKey key{config.tokens_per_rank, config.hidden, config.intermediate, config.num_experts, config.top_k,
                     config.shared_width(), device, options.minibatch_rows, options.ring_slots,
                     options.ctas_per_rank, options.comm_ctas_per_rank, options.lookahead,
                     static_cast<int64_t>(options.timeout_seconds * 1000)};
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[key];
  if (!slot) slot = std::make_unique<mok::FusedForward>(config, options);
  return *slot;
}

std::vector<at::Tensor> fused_forward_checked(at::TensorList x, at::TensorList expert_ids, at::TensorList weights,
                                      at::TensorList w13, at::TensorList w2,
                                      const std::optional<at::Tensor>& shared_w13,
                                      const std::optional<at::Tensor>& shared_w2, int64_t num_experts,
                                      int64_t minibatch_rows, int64_t ring_slots, int64_t ctas_per_rank,
                                      int64_t comm_ctas_per_rank, int64_t lookahead, bool check_errors) {
  const int64_t R = static_cast<int64_t>(x.size());
  expect(R >= 1, "x must hold one tensor per rank");
  expect(static_cast<int64_t>(expert_ids.size()) == R && static_cast<int64_t>(weights.size()) == R &&
             static_cast<int64_t>(w13.size()) == R && static_cast<int64_t>(w2.size()) == R,
         "x, expert_ids, weights, w13 and w2 must each hold " + num(R) + " tensors (one per rank)");
  const at::Device device = x[0].device();
  expect(device.is_cuda(), "x[0] must be a CUDA tensor");
  expect(x[0].dim() == 2, "x[0] must be [T, H]");
  const int64_t H = x[0].size(1);
  const int64_t k = expert_ids[0].dim() == 2 ? expert_ids[0].size(1) : 0;
  const int64_t I = w2[0].dim() == 3 ? w2[0].size(2) : 0;
  const bool has_shared = shared_w13.has_value() && shared_w13->defined();
  expect(has_shared == (shared_w2.has_value() && shared_w2->defined()),
         "give both shared_w13 and shared_w2, or neither");

  mok::LayerConfig config;
  config.hidden = static_cast<int>(H);
  config.intermediate = static_cast<int>(I);
  config.num_experts = static_cast<int>(num_experts);
  config.top_k = static_cast<int>(k);
  config.world_size = static_cast<int>(R);
  if (has_shared) {
    check(*shared_w13, "shared_w13", at::kBFloat16, 2, device);
    check(*shared_w2, "shared_w2", at::kBFloat16, 2, device);
    config.num_shared_experts = 1;
    config.shared_intermediate = static_cast<int>(shared_w2->size(1));
    expect(shared_w13->size(0) == 2 * shared_w2->size(1) && shared_w13->size(1) == H && shared_w2->size(0) == H,
           "shared_w13 must be [2S, H] and shared_w2 [H, S] with H = " + num(H));
  }
  const int64_t El = num_experts / R;
  for (int64_t r = 0; r < R; ++r) {
    const std::string at = "[" + std::to_string(r) + "]";
    check(x[r], "x" + at, at::kBFloat16, 2, device);
    check(expert_ids[r], "expert_ids" + at, at::kInt, 2, device);
    check(weights[r], "weights" + at, at::kFloat, 2, device);
    check(w13[r], "w13" + at, at::kBFloat16, 3, device);
    check(w2[r], "w2" + at, at::kBFloat16, 3, device);
    const int64_t T = x[r].size(0);
    expect(x[r].size(1) == H, "x" + at + " must be [T, " + num(H) + "]");
    expect(expert_ids[r].size(0) == T && expert_ids[r].size(1) == k,
           "expert_ids" + at + " must be [" + num(T) + ", " + num(k) + "]");
    expect(weights[r].size(0) == T && weights[r].size(1) == k,
           "weights" + at + " must be [" + num(T) + ", " + num(k) + "]");
    expect(w13[r].size(0) == El && w13[r].size(1) == 2 * I && w13[r].size(2) == H,
           "w13" + at + " must be [E/R, 2I, H] = [" + num(El) + ", " + num(2 * I) + ", " + num(H) + "]");
    expect(w2[r].size(0) == El && w2[r].size(1) == H && w2[r].size(2) == I,
           "w2" + at + " must be [E/R, H, I] = [" + num(El) + ", " + num(H) + ", " + num(I) + "]");
    config.tokens_per_rank.push_back(static_cast<int>(T));
  }

  const mok::FusedForwardOptions options =
      mok::torch_ops::tuning_options(minibatch_rows, ring_slots, ctas_per_rank, comm_ctas_per_rank, lookahead);

  const c10::cuda::CUDAGuard guard(device);
  std::vector<at::Tensor> out;
  std::vector<mok::RankTensors> tensors(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    out.push_back(at::empty_like(x[r]));
    mok::RankTensors& t = tensors[static_cast<size_t>(r)];
    t.x = x[r].data_ptr();
    t.expert_ids = expert_ids[r].data_ptr<int32_t>();
    t.weights = weights[r].data_ptr<float>();
    t.out = out.back().data_ptr();
    t.w13 = w13[r].data_ptr();
    t.w2 = w2[r].data_ptr();
    t.shared_w13 = has_shared ? shared_w13->data_ptr() : nullptr;
    t.shared_w2 = has_shared ? shared_w2->data_ptr() : nullptr;
  }
  mok::FusedForward& forward = cached_forward(config, options);
  auto stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  forward.run(tensors, stream);
  if (check_errors) forward.check(stream);
  return out;
}

std::vector<at::Tensor> fused_forward(at::TensorList x, at::TensorList expert_ids, at::TensorList weights,
                                      at::TensorList w13, at::TensorList w2,
                                      const std::optional<at::Tensor>& shared_w13,
                                      const std::optional<at::Tensor>& shared_w2, int64_t num_experts,
                                      int64_t minibatch_rows, int64_t ring_slots, int64_t ctas_per_rank,
                                      int64_t comm_ctas_per_rank, int64_t lookahead, bool check_errors) {
  return mok::torch_ops::guarded(last_error_message(), std::vector<at::Tensor>{}, [&] {
    return fused_forward_checked(x, expert_ids, weights, w13, w2, shared_w13, shared_w2, num_experts,
                                 minibatch_rows, ring_slots, ctas_per_rank, comm_ctas_per_rank, lookahead,
                                 check_errors);
  });
}

std::string last_error() { return last_error_message(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
  m.def(
      "fused_forward(Tensor[] x, Tensor[] expert_ids, Tensor[] weights, Tensor[] w13, Tensor[] w2, "
      "Tensor? shared_w13, Tensor? shared_w2, int num_experts, int minibatch_rows=0, int ring_slots=0, "
      "int ctas_per_rank=0, int comm_ctas_per_rank=0, int lookahead=0, bool check_errors=False) -> Tensor[]");
  m.def("last_error() -> str", &last_error);
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) { m.impl("fused_forward", &fused_forward); }
