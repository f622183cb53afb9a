// mok::fused_forward_train_node: the fused forward for one rank, recorded by
// autograd as a C++ node whose backward is the staged backward
// (mok::staged_backward), in save mode (the training op keeps gate/up and
// its schedule) or recompute mode (the plain op; the backward recomputes
// both). The same kernels, tables and arguments as the Python path
// (mok/eager_autograd.py's FusedForwardTrain and FusedForward with
// mok/autograd.py's setups and backwards), so the same bits; what it removes
// is host time before the backward's first kernel.
//
// Why: from autograd.grad's call to the staged chain's op, the Python node
// spent ~130 us (autograd.grad) to ~300 us (loss.backward() into existing
// .grads) in Python on the autograd's device thread -- the Function's
// wrapper, the saved tensors, the needs, the in-place checks -- with the GPU
// idle (docs/perf-notes.md v34). Here the engine calls the backward directly.
//
// Scope: eager mode, CUDA tensors, one rank (R = 1), the staged backward
// (MOK_BACKWARD unset, "auto" or "staged"). mok.fused_forward picks this op
// there (MOK_CPP_AUTOGRAD=0 keeps the Python node); everything else -- a
// virtual world of R > 1, the fused backward kernel, torch.compile, dispatch
// modes -- keeps the Python path, which stays the reference.
//
// The op has an Autograd kernel only: called below autograd it has no
// kernel, by design (nothing but the autograd path calls it).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "op_errors.hpp"
#include "op_handles.hpp"

namespace {

using OptTensor = std::optional<at::Tensor>;
using mok::torch_ops::mok_op;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The ops this node calls, with the C++ signatures their kernels were
// registered with (fused_forward_train_ops.cpp, staged_schedule_ops.cpp,
// staged_backward_ops.cpp).
using TrainOutputs = std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>,
                                std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>>;
using PlainSignature = std::vector<at::Tensor>(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                                               at::TensorList, const OptTensor&, const OptTensor&, int64_t,
                                               at::IntArrayRef, bool, int64_t);
using TrainSignature = TrainOutputs(at::TensorList, at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                                    const OptTensor&, const OptTensor&, int64_t, at::IntArrayRef, bool, bool, int64_t);
using ScheduleSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(at::TensorList, at::TensorList,
                                                                         at::IntArrayRef, int64_t);
using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using BackwardSignature = Grads(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const at::Tensor&, const at::Tensor&, const OptTensor&, const OptTensor&,
                                const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                                const OptTensor&, const OptTensor&, at::IntArrayRef, std::optional<at::ScalarType>,
                                const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&);

struct Ops {
  c10::TypedOperatorHandle<PlainSignature> plain = mok_op<PlainSignature>("mok::fused_forward");
  c10::TypedOperatorHandle<TrainSignature> train = mok_op<TrainSignature>("mok::fused_forward_train");
  c10::TypedOperatorHandle<ScheduleSignature> schedule = mok_op<ScheduleSignature>("mok::staged_schedule");
  c10::TypedOperatorHandle<BackwardSignature> backward = mok_op<BackwardSignature>("mok::staged_backward");
};

const Ops& ops() {
  static const Ops o;
  return o;
}

// The forward's variable inputs, in the order autograd numbers their edges
// (needs_input_grad's index): x, expert_ids, weights, w13, w2, then
// shared_w13 and shared_w2 when given. (The main_grad buffers, later
// arguments, are taken as plain values: they never get a gradient.)
enum Edge : int64_t { kX = 0, kExpertIds, kWeights, kW13, kW2, kSharedW13, kSharedW2 };

// The weight's .grad if this backward may add the weight's gradient to it in
// place and return none: mok/autograd.py's _grad_in_place, condition for
// condition (see its module docstring), plus hooks on the weight's
// AccumulateGrad node itself, which the Python check cannot see.
at::Tensor grad_in_place(const at::Tensor& weight) {
  if (!weight.defined() || !weight.is_leaf() || !weight.requires_grad() || weight.scalar_type() != at::kBFloat16) {
    return {};
  }
  const at::Tensor& grad = weight.grad();
  if (!grad.defined() || grad.scalar_type() != at::kBFloat16 || grad.sizes() != weight.sizes() ||
      grad.device() != weight.device() || grad.layout() != at::kStrided || !grad.is_contiguous() ||
      grad.requires_grad() || reinterpret_cast<uintptr_t>(grad.data_ptr()) % 16 != 0) {
    return {};
  }
  if (!torch::autograd::impl::hooks(weight).empty() || torch::autograd::impl::post_acc_grad_hooks(weight)) {
    return {};
  }
  const std::shared_ptr<torch::autograd::Node> node = torch::autograd::impl::try_get_grad_accumulator(weight);
  if (!node || !node->pre_hooks().empty() || !node->post_hooks().empty() || !node->tensor_pre_hooks().empty() ||
      !node->retains_grad_hooks().empty()) {
    return {};
  }
  // Whether the engine will run the weight's AccumulateGrad in this backward:
  // in the graph, and (autograd.grad, or backward(inputs=...)) marked to run
  // and not captured as an autograd.grad output.
  const auto* in_graph = torch::autograd::get_current_graph_task_nodes_in_graph();
  const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
  if (in_graph == nullptr || exec_info == nullptr || in_graph->count(node.get()) == 0) return {};
  if (!exec_info->empty()) {
    const auto it = exec_info->find(node.get());
    if (it == exec_info->end() || !it->second.should_execute() || it->second.captures_) return {};
  }
  return grad;
}

bool grad_in_place_enabled() {
  const char* v = std::getenv("MOK_GRAD_IN_PLACE");  // read at each backward, as the Python path does
  return v == nullptr || std::string(v) != "0";
}

struct TrainNode : public torch::autograd::Function<TrainNode> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& expert_ids,
                            const at::Tensor& weights, const at::Tensor& w13, const at::Tensor& w2,
                            const OptTensor& shared_w13, const OptTensor& shared_w2, int64_t num_experts,
                            at::IntArrayRef tuning, bool check_errors, int64_t token_capacity,
                            bool save_activations, c10::IValue main_grads) {
    // Save mode's kept state; undefined in recompute mode, where the
    // backward gets no pre-activations or schedule and rebuilds both.
    at::Tensor out, preact, shared_preact, expert_rows, expert_offset, schedule_rows, entry_of_row, row_of_entry,
        token_of_row;
    // Straight to the kernels: the ops' autograd kernels (torch.library's, in
    // Python) have nothing to record here.
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    if (!save_activations) {
      out = ops().plain.call({x}, {expert_ids}, {weights}, {w13}, {w2}, shared_w13, shared_w2, num_experts, tuning,
                             check_errors, token_capacity)[0];
    } else {
      auto [outs, preacts, shared_preacts, rows, offsets, schedules] =
          ops().train.call({x}, {expert_ids}, {weights}, {w13}, {w2}, shared_w13, shared_w2, num_experts, tuning,
                           check_errors, /*keep_preact=*/true, token_capacity);
      out = outs[0];
      preact = preacts[0];
      shared_preact = shared_preacts[0];
      expert_rows = rows[0];
      expert_offset = offsets[0];
      schedule_rows = schedules[0];
      // The staged chain's row tables (mok/staged_backward.py, saved_schedule),
      // enqueued behind the forward's kernel.
      std::tie(entry_of_row, row_of_entry, token_of_row) =
          ops().schedule.call({schedule_rows}, {expert_offset}, {x.size(0)}, expert_ids.size(1));
    }
    ctx->set_materialize_grads(false);  // an unused out gets None: zeros are made only if needed
    ctx->save_for_backward({x, expert_ids, weights, w13, w2, shared_w13.value_or(at::Tensor()),
                            shared_w2.value_or(at::Tensor()), preact, shared_preact, entry_of_row, row_of_entry,
                            expert_offset, expert_rows});
    // Not saved variables: a main_grad changes between the forward and the
    // backward by design (other micro-batches' backwards add to it).
    ctx->saved_data["main_grads"] = std::move(main_grads);
    ctx->saved_data["shared"] = shared_w13.has_value();
    ctx->saved_data["save"] = save_activations;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    if (at::GradMode::is_enabled()) {
      TORCH_CHECK_NOT_IMPLEMENTED(false, "mok: mok.fused_forward's backward has no backward of its own "
                                         "(create_graph=True is not supported)");
    }
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &expert_ids = s[1], &weights = s[2], &w13 = s[3], &w2 = s[4];
    const bool shared = ctx->saved_data["shared"].toBool();
    const OptTensor shared_w13 = shared ? OptTensor(s[5]) : std::nullopt;
    const OptTensor shared_w2 = shared ? OptTensor(s[6]) : std::nullopt;
    const bool save = ctx->saved_data["save"].toBool();
    auto kept = [&](size_t i) { return save ? OptTensor(s[i]) : std::nullopt; };

    const bool need_x = ctx->needs_input_grad(kX), need_weights = ctx->needs_input_grad(kWeights);
    const bool need_w13 = ctx->needs_input_grad(kW13), need_w2 = ctx->needs_input_grad(kW2);
    const bool need_sw13 = shared && ctx->needs_input_grad(kSharedW13);
    const bool need_sw2 = shared && ctx->needs_input_grad(kSharedW2);

    // Where each weight gradient goes: its main_grad (fp32) when the trainer
    // hung one on the weight, else its bf16 .grad in place where allowed,
    // else returned.
    const c10::List<OptTensor> main_grads = ctx->saved_data["main_grads"].toOptionalTensorList();
    std::vector<OptTensor> into(4);
    const bool in_place = grad_in_place_enabled();
    const at::Tensor* weight_of[4] = {&w13, &w2, shared ? &s[5] : nullptr, shared ? &s[6] : nullptr};
    const bool needed[4] = {need_w13, need_w2, need_sw13, need_sw2};
    for (int i = 0; i < 4; ++i) {
      const OptTensor main = main_grads.get(i);
      if (!needed[i]) continue;
      if (main.has_value() && main->defined()) {
        into[i] = main;
      } else if (in_place && weight_of[i] != nullptr) {
        at::Tensor grad = grad_in_place(*weight_of[i]);
        if (grad.defined()) into[i] = grad;
      }
    }

    const at::Tensor dout = grad_outputs[0].defined() ? grad_outputs[0] : at::zeros_like(x);
    const std::optional<at::ScalarType> grad_dtype =
        w13.scalar_type() == at::kBFloat16 ? std::optional<at::ScalarType>(at::kBFloat16) : std::nullopt;
    const std::vector<int64_t> needs = {need_x, need_weights, need_w13, need_w2, need_sw13, need_sw2};
    Grads grads;
    {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      grads = ops().backward.call(dout, x, expert_ids, weights, w13, w2, shared_w13, shared_w2, kept(7),
                                  shared ? kept(8) : std::nullopt, kept(9), kept(10), kept(11), kept(12), needs,
                                  grad_dtype, into[0], into[1], into[2], into[3]);
    }
    auto [dx, dweights, dw13, dw2, dsw13, dsw2] = grads;
    auto as = [](const at::Tensor& g, const at::Tensor& like) { return g.defined() ? g.to(like.scalar_type()) : g; };
    // One entry per forward argument: x, expert_ids, weights, w13, w2,
    // shared_w13, shared_w2, then the six non-differentiable ones.
    return {as(dx, x),
            at::Tensor(),
            as(dweights, weights),
            as(dw13, w13),
            as(dw2, w2),
            shared ? as(dsw13, s[5]) : at::Tensor(),
            shared ? as(dsw2, s[6]) : at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

at::Tensor fused_forward_train_node(const at::Tensor& x, const at::Tensor& expert_ids, const at::Tensor& weights,
                                    const at::Tensor& w13, const at::Tensor& w2, const OptTensor& shared_w13,
                                    const OptTensor& shared_w2, int64_t num_experts, at::IntArrayRef tuning,
                                    bool check_errors, int64_t token_capacity, bool save_activations,
                                    const OptTensor& main_w13,
                                    const OptTensor& main_w2, const OptTensor& main_shared_w13,
                                    const OptTensor& main_shared_w2) {
  mok::torch_ops::expect(shared_w13.has_value() == shared_w2.has_value(),
                         "fused_forward_train_node: give shared_w13 and shared_w2 together, or neither");
  c10::List<OptTensor> main_grads({main_w13, main_w2, main_shared_w13, main_shared_w2});
  return TrainNode::apply(x, expert_ids, weights, w13, w2, shared_w13, shared_w2, num_experts, tuning, check_errors,
                          token_capacity, save_activations, c10::IValue(std::move(main_grads)));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
  m.def(
      "fused_forward_train_node(Tensor x, Tensor expert_ids, Tensor weights, Tensor w13, Tensor w2, "
      "Tensor? shared_w13, Tensor? shared_w2, int num_experts, int[] tuning, bool check_errors, int token_capacity, "
      "bool save_activations, Tensor? main_w13, Tensor? main_w2, Tensor? main_shared_w13, Tensor? main_shared_w2) -> Tensor");
}

TORCH_LIBRARY_IMPL(mok, Autograd, m) { m.impl("fused_forward_train_node", &fused_forward_train_node); }
