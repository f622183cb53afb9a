// torch.ops.mok.fused_forward_train: the fused forward in training mode (save):
// the same pass and output bits as mok::fused_forward, which also keeps, per
// rank, what the backward reads instead of recomputing it:
//   preact         bf16 [saved rows, 2I]  each routed row's [gate | up], by schedule row
//   shared_preact  bf16 [T, 2S]           the shared expert's, by token ([T, 0] without one)
//   expert_rows    int32 [E/R]            the schedule: real rows per local expert,
//   expert_offset  int32 [E/R + 1]        their padded start rows,
//   schedule_rows  int32 [saved rows, 3]  and each row's home (rank, token, slot), rank -1: padding
// Rows past expert_offset[-1], and padding rows, hold no data.
//
// keep_preact=False (recompute mode of the fused backward): the pass keeps
// the schedule only, not the pre-activations (no buffers are allocated or
// given to the library: RankTensors::preact and shared_preact stay null, so
// the inference instantiation of the kernel runs, with the caller's pass
// state). preact and shared_preact then come back as EMPTY LISTS (not a
// tensor per rank): the other four outputs are as with keep_preact=True, and
// the five after out, passed on unchanged, are what torch.ops.mok.fused_backward
// takes in its recompute mode (empty preact lists mean recompute). Empty
// lists rather than zero-size tensors: nothing to allocate, nothing the
// fake kernel or torch.compile has to size, and no tensor that looks like
// saved pre-activations. The output bits are the same either way. The
// default (True) keeps the schema's old calls and traces as they were. Kernels: CUDA,
// Meta, CPU (refuses). The argument checks are fused_forward's.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "forward_cache.hpp"
#include "forward_call.hpp"
#include "forward_tensors.hpp"
#include "mok/fused_forward.hpp"
#include "op_errors.hpp"
#include "op_outputs.hpp"
#include "padding_rows.hpp"

namespace {

using TrainOutputs = std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>,
                                std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>>;

// The saved tensors' shapes (the same on the CUDA and Meta paths); without
// keep_preact, preact and shared_preact are empty lists. Allocated without
// torch's deterministic fill (op_outputs.hpp): the pass or the schedule's
// copies write every element, except preact's padding rows, cleared after
// the pass while that fill is on.
TrainOutputs allocate(const mok::torch_ops::ForwardCall& call, at::TensorList x, bool keep_preact) {
  using mok::torch_ops::written_output;
  const mok::LayerConfig& c = call.config;
  const int64_t rows = mok::FusedForward::saved_rows_for(c);
  const int64_t El = c.experts_per_rank();
  const at::TensorOptions bf16 = x[0].options();
  const at::TensorOptions i32 = x[0].options().dtype(at::kInt);
  TrainOutputs o;
  for (size_t r = 0; r < x.size(); ++r) {
    std::get<0>(o).push_back(mok::torch_ops::written_output_like(x[r]));
    if (keep_preact) {
      std::get<1>(o).push_back(written_output({rows, 2 * static_cast<int64_t>(c.intermediate)}, bf16));
      std::get<2>(o).push_back(written_output({x[r].size(0), 2 * static_cast<int64_t>(c.shared_width())}, bf16));
    }
    std::get<3>(o).push_back(written_output({El}, i32));
    std::get<4>(o).push_back(written_output({El + 1}, i32));
    std::get<5>(o).push_back(written_output({rows, 3}, i32));
  }
  return o;
}

TrainOutputs fused_forward_train_cuda(at::TensorList x, at::TensorList expert_ids, at::TensorList weights,
                                      at::TensorList w13, at::TensorList w2,
                                      const std::optional<at::Tensor>& shared_w13,
                                      const std::optional<at::Tensor>& shared_w2, int64_t num_experts,
                                      at::IntArrayRef tuning, bool check_errors, bool keep_preact,
                                      int64_t token_capacity) {
  const auto call = mok::torch_ops::check_forward_arguments(x, expert_ids, weights, w13, w2, shared_w13, shared_w2,
                                                            num_experts, tuning, token_capacity);
  const c10::cuda::CUDAGuard guard(call.device);
  TrainOutputs o = allocate(call, x, keep_preact);
  auto& [out, preact, shared_preact, expert_rows, expert_offset, schedule_rows] = o;
  mok::torch_ops::raising_torch_errors([&] {
    auto cached = mok::torch_ops::cached_forward(call.key, call.config);
    auto stream = c10::cuda::getCurrentCUDAStream(call.device.index()).stream();
    const std::lock_guard<std::mutex> lock(cached->mutex);
    mok::FusedForward& forward = *cached->forward;
    // Each rank's pass state (its schedule) in one byte tensor; the schedule
    // tensors are copied out of it after the pass, on the same stream.
    const auto regions = forward.pass_state_regions();
    std::vector<at::Tensor> states;
    std::vector<mok::RankTensors> tensors;
    for (size_t r = 0; r < x.size(); ++r) {
      states.push_back(at::empty({static_cast<int64_t>(forward.pass_state_bytes())}, x[0].options().dtype(at::kByte)));
      mok::RankTensors t = mok::torch_ops::rank_tensors(x[r], expert_ids[r], weights[r], w13[r], w2[r], shared_w13,
                                                        shared_w2, call.has_shared, out[r]);
      t.tokens = call.tokens[r];
      t.pass_state = states.back().data_ptr();
      if (keep_preact) {  // else null: the schedule (pass_state) only
        t.preact = preact[r].data_ptr();
        t.shared_preact = call.has_shared ? shared_preact[r].data_ptr() : nullptr;
      }
      tensors.push_back(t);
    }
    forward.run(tensors, stream);
    if (check_errors) forward.check(stream);
    auto ints = [](const at::Tensor& state, size_t offset, int64_t count) {
      return state.narrow(0, static_cast<int64_t>(offset), count * 4).view(at::kInt);
    };
    for (size_t r = 0; r < x.size(); ++r) {
      expert_rows[r].copy_(ints(states[r], regions.expert_rows, expert_rows[r].numel()));
      expert_offset[r].copy_(ints(states[r], regions.expert_offset, expert_offset[r].numel()));
      schedule_rows[r].copy_(ints(states[r], regions.rows, schedule_rows[r].numel()).view({-1, 3}));
      if (keep_preact && mok::torch_ops::clear_unwritten_rows(false)) {
        mok::torch_ops::zero_padding_rows(preact[r], expert_offset[r], expert_rows[r]);
      }
    }
  });
  return o;
}

TrainOutputs fused_forward_train_meta(at::TensorList x, at::TensorList expert_ids, at::TensorList weights,
                                      at::TensorList w13, at::TensorList w2,
                                      const std::optional<at::Tensor>& shared_w13,
                                      const std::optional<at::Tensor>& shared_w2, int64_t num_experts,
                                      at::IntArrayRef tuning, bool /*check_errors*/, bool keep_preact,
                                      int64_t token_capacity) {
  return allocate(mok::torch_ops::check_forward_arguments(x, expert_ids, weights, w13, w2, shared_w13, shared_w2,
                                                          num_experts, tuning, token_capacity),
                  x, keep_preact);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
  m.def(
      "fused_forward_train(Tensor[] x, Tensor[] expert_ids, Tensor[] weights, Tensor[] w13, Tensor[] w2, "
      "Tensor? shared_w13, Tensor? shared_w2, int num_experts, int[] tuning, bool check_errors=False, "
      "bool keep_preact=True, int token_capacity=0) -> "
      "(Tensor[] out, Tensor[] preact, Tensor[] shared_preact, Tensor[] expert_rows, Tensor[] expert_offset, "
      "Tensor[] schedule_rows)");
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) { m.impl("fused_forward_train", &fused_forward_train_cuda); }
TORCH_LIBRARY_IMPL(mok, Meta, m) { m.impl("fused_forward_train", &fused_forward_train_meta); }
// CPU tensors reach the same checks, which refuse them by name.
TORCH_LIBRARY_IMPL(mok, CPU, m) { m.impl("fused_forward_train", &fused_forward_train_cuda); }
