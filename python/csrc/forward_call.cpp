#include "forward_call.hpp"

#include <c10/cuda/CUDAStream.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "forward_tensors.hpp"
#include "op_checks.hpp"
#include "op_outputs.hpp"
#include "tuning_options.hpp"

namespace mok::torch_ops {

std::vector<at::Tensor> outputs_like(at::TensorList x) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : x) out.push_back(written_output_like(t));
  return out;
}

std::vector<RankTensors> rank_tensor_list(const ForwardCall& call, at::TensorList x, at::TensorList expert_ids,
                                          at::TensorList weights, at::TensorList w13, at::TensorList w2,
                                          const std::optional<at::Tensor>& shared_w13,
                                          const std::optional<at::Tensor>& shared_w2, std::vector<at::Tensor>& out) {
  std::vector<RankTensors> tensors;
  for (size_t r = 0; r < x.size(); ++r) {
    tensors.push_back(rank_tensors(x[r], expert_ids[r], weights[r], w13[r], w2[r], shared_w13, shared_w2,
                                   call.has_shared, out[r]));
    tensors.back().tokens = call.tokens[r];
  }
  return tensors;
}

void run_cached_forward(const ForwardCall& call, const std::vector<RankTensors>& tensors, bool check_errors) {
  raising_torch_errors([&] {
    auto cached = cached_forward(call.key, call.config);
    auto stream = c10::cuda::getCurrentCUDAStream(call.device.index()).stream();
    const std::lock_guard<std::mutex> lock(cached->mutex);
    cached->forward->run(tensors, stream);
    if (check_errors) cached->forward->check(stream);
  });
}

int token_bucket() {
  static const int bucket = [] {
    const char* env = std::getenv("MOK_TOKEN_BUCKET");
    const long value = env != nullptr ? std::strtol(env, nullptr, 10) : 0;
    return value > 0 && value <= (1 << 20) ? static_cast<int>(value) : 0;
  }();
  return bucket;
}

std::vector<int> capacity_counts(const std::vector<int>& tokens, int64_t token_capacity) {
  expect(token_capacity >= 0, "token_capacity = " + num(token_capacity) + " must be >= 0 (0: none)");
  if (token_capacity == 0) return tokens;
  const int capacity = checked_int(token_capacity, "token_capacity");
  for (size_t r = 0; r < tokens.size(); ++r) {
    expect(tokens[r] <= capacity, std::string("x") + at_rank(static_cast<int64_t>(r)) + " has " + num(tokens[r]) +
                                      " tokens, more than token_capacity = " + num(token_capacity));
  }
  return std::vector<int>(tokens.size(), capacity);
}

ForwardCall check_forward_arguments(at::TensorList x, at::TensorList expert_ids, at::TensorList weights,
                                    at::TensorList w13, at::TensorList w2,
                                    const std::optional<at::Tensor>& shared_w13,
                                    const std::optional<at::Tensor>& shared_w2, int64_t num_experts,
                                    at::IntArrayRef tuning, int64_t token_capacity, at::ScalarType expert_dtype) {
  const TensorSpec expert_weights{expert_dtype, 3, /*aligned=*/true};
  const int64_t R = static_cast<int64_t>(x.size());
  expect(R >= 1, "x must hold one tensor per rank (got an empty list)");
  expect(static_cast<int64_t>(expert_ids.size()) == R && static_cast<int64_t>(weights.size()) == R &&
             static_cast<int64_t>(w13.size()) == R && static_cast<int64_t>(w2.size()) == R,
         "x, expert_ids, weights, w13 and w2 must each hold " + num(R) + " tensors (one per rank)");
  expect(num_experts >= R && num_experts % R == 0,
         "num_experts = " + num(num_experts) + " must be a positive multiple of the world size R = " + num(R));

  ForwardCall call;
  call.device = x[0].device();
  expect_cuda(call.device, "x[0]");
  check_tensor(x[0], "x[0]", kActivations, call.device);
  check_tensor(expert_ids[0], "expert_ids[0]", kExpertIds, call.device);
  check_tensor(w2[0], "w2[0]", expert_weights, call.device);
  const int64_t H = x[0].size(1), k = expert_ids[0].size(1), I = w2[0].size(2), El = num_experts / R;

  mok::LayerConfig& config = call.config;
  config.hidden = checked_int(H, "H (x[0].size(1))");
  config.intermediate = checked_int(I, "I (w2[0].size(2))");
  config.num_experts = checked_int(num_experts, "num_experts");
  config.top_k = checked_int(k, "k (expert_ids[0].size(1))");
  config.world_size = checked_int(R, "the world size (len(x))");
  if (expert_dtype == at::kFloat8_e4m3fn) config.dtype = DType::kFP8E4M3;

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
    const std::string at = at_rank(r);
    check_tensor(x[r], "x" + at, kActivations, call.device);
    check_tensor(expert_ids[r], "expert_ids" + at, kExpertIds, call.device);
    check_tensor(weights[r], "weights" + at, kRoutingWeights, call.device);
    check_tensor(w13[r], "w13" + at, expert_weights, call.device);
    check_tensor(w2[r], "w2" + at, expert_weights, call.device);
    const int64_t T = x[r].size(0);
    check_shape(x[r], "x" + at, {T, H}, "[T, H]");
    check_shape(expert_ids[r], "expert_ids" + at, {T, k}, "[T, k]");
    check_shape(weights[r], "weights" + at, {T, k}, "[T, k]");
    check_shape(w13[r], "w13" + at, {El, 2 * I, H}, "[E/R, 2I, H]");
    check_shape(w2[r], "w2" + at, {El, H, I}, "[E/R, H, I]");
    config.tokens_per_rank.push_back(checked_int(T, "T (x" + at + ".size(0))"));
  }

  call.tokens = config.tokens_per_rank;
  config.tokens_per_rank = capacity_counts(call.tokens, token_capacity);
  if (const int bucket = token_bucket(); token_capacity == 0 && bucket > 0) {
    for (int& t : config.tokens_per_rank) t = checked_int((static_cast<int64_t>(t) + bucket - 1) / bucket * bucket,
                                                          "a token count rounded up to MOK_TOKEN_BUCKET");
  }
  ForwardKey& key = call.key;
  key.tokens_per_rank = config.tokens_per_rank;
  key.hidden = config.hidden;
  key.intermediate = config.intermediate;
  key.num_experts = config.num_experts;
  key.top_k = config.top_k;
  key.shared_width = config.shared_width();
  key.dtype = static_cast<int>(config.dtype);
  key.device = call.device.is_cuda() ? call.device.index() : -1;
  key.tuning = tuning_values(tuning);
  forward_options(key.tuning);  // refuses values that do not fit an int, before launch
  return call;
}

}  // namespace mok::torch_ops
