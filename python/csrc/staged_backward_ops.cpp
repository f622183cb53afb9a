// mok::staged_backward: the staged backward's chain of kernels
// (python/mok/staged_backward.py, layer_backward) enqueued from C++ in one
// op call, for CUDA tensors.
//
// Why: enqueued from Python, the chain's ~20 launches and torch ops cost
// ~0.5 ms of host time a call on the DeepSeek-V3 slice (docs/perf-notes.md
// v31), during which an idle GPU waits -- before the first kernel and again
// between the scatter and the SwiGLU backward. Layers whose kernels take ~1
// ms (H 1536-2048) spent a third of their backward that way. Here each step
// is one dispatcher call with no Python between them.
//
// The dataflow is layer_backward's, step for step and with the same
// kernels, so the gradients are bitwise the Python chain's (a GPU test,
// python/tests/test_staged_backward_op_gpu.py, holds the two together); the
// Python chain stays as the reference composition: the CPU tests run it
// with mok.testing's fp32 ops, and torch.compile traces it (this op has no
// Meta kernel; the autograd uses it in eager mode only).
//
// Each kernel is reached through the dispatcher (torch.ops.mok's own ops),
// so every argument check stays where the op is defined.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "op_checks.hpp"
#include "op_errors.hpp"
#include "op_handles.hpp"

namespace {

using mok::torch_ops::expect;
using OptTensor = std::optional<at::Tensor>;
using mok::torch_ops::mok_op;

// torch.ops.mok's kernels, with the exact C++ signatures they were registered
// with (the dispatcher checks that a typed handle matches its kernel's).
struct Kernels {
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>
      grouped_mm = mok_op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
          "mok::grouped_mm");
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      bool)>
      grouped_mm_kn = mok_op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        bool)>("mok::grouped_mm_kn");
  c10::TypedOperatorHandle<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&, const at::Tensor&,
      const at::Tensor&, bool)>
      swiglu_backward_mm = mok_op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
          const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&, const at::Tensor&,
          const at::Tensor&, bool)>("mok::swiglu_backward_mm");
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      int64_t, std::optional<at::ScalarType>)>
      weight_grad_mm = mok_op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, int64_t, std::optional<at::ScalarType>)>(
          "mok::weight_grad_mm");
  c10::TypedOperatorHandle<void(at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const at::Tensor&)>
      weight_grad_mm_acc = mok_op<void(at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                       const at::Tensor&)>("mok::weight_grad_mm_acc_");
  c10::TypedOperatorHandle<std::vector<at::Tensor>(const std::vector<at::Tensor>&, const at::Tensor&,
                                                   const at::Tensor&, bool)>
      scatter_rows = mok_op<std::vector<at::Tensor>(const std::vector<at::Tensor>&, const at::Tensor&,
                                                    const at::Tensor&, bool)>("mok::scatter_rows");
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&)> row_combine =
      mok_op<at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&)>("mok::row_combine");
};

// Found once, at the first call (every op is registered by then: they live
// in this library).
const Kernels& kernels() {
  static const Kernels k;
  return k;
}

// staged_backward.Needs, in its field order.
struct Needs {
  bool x, weights, w13, w2, shared_w13, shared_w2;
};

// Rows in schedule order: staged_backward.Schedule without token_of_row.
struct Schedule {
  at::Tensor entry_of_row, row_of_entry, group_offset, group_rows;
};

// staged_backward.routed_schedule (recompute mode): each expert's rows in
// global token order, by a stable sort; no host synchronisation.
Schedule routed_schedule(const at::Tensor& expert_ids, int64_t num_experts) {
  const at::Tensor flat = expert_ids.reshape({-1});
  auto [sorted_ids, entry_of_row] = at::sort(flat, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  const at::Tensor bounds = at::arange(num_experts + 1, flat.options());
  const at::Tensor offsets = at::searchsorted(sorted_ids, bounds);
  const at::Tensor row_of_entry = at::argsort(entry_of_row, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  return {entry_of_row, row_of_entry, offsets.to(at::kInt),
          (offsets.slice(0, 1) - offsets.slice(0, 0, num_experts)).to(at::kInt)};
}

// _weight_grads for one gradient: added to `main` when given (nothing
// returned), else returned; undefined when not needed.
at::Tensor weight_grad(bool needed, const at::Tensor& a, const at::Tensor& b, const OptTensor& main,
                       const at::Tensor& group_offset, const at::Tensor& group_rows, int64_t groups,
                       std::optional<at::ScalarType> grad_dtype) {
  if (!needed) return {};
  if (main.has_value()) {
    at::Tensor out = main->view({groups, main->size(-2), main->size(-1)});
    kernels().weight_grad_mm_acc.call(out, a, b, group_offset, group_rows);
    return {};
  }
  return kernels().weight_grad_mm.call(a, b, group_offset, group_rows, groups, grad_dtype);
}

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// layer_backward (see its docstring for every argument); the schedule's four
// tensors all given (the saved schedule of save mode) or all absent (then
// routed_schedule). A gradient not needed, or added to its main buffer, comes
// back undefined (None in Python).
Grads staged_backward(const at::Tensor& dout_in, const at::Tensor& x, const at::Tensor& expert_ids,
                      const at::Tensor& weights, const at::Tensor& w13, const at::Tensor& w2,
                      const OptTensor& shared_w13, const OptTensor& shared_w2, const OptTensor& preact,
                      const OptTensor& shared_preact, const OptTensor& entry_of_row, const OptTensor& row_of_entry,
                      const OptTensor& group_offset, const OptTensor& group_rows, at::IntArrayRef needs_flags,
                      std::optional<at::ScalarType> grad_dtype, const OptTensor& main_w13, const OptTensor& main_w2,
                      const OptTensor& main_shared_w13, const OptTensor& main_shared_w2) {
  expect(needs_flags.size() == 6, "staged_backward: needs must have 6 entries (x, weights, w13, w2, shared_w13, "
                                  "shared_w2), got " + mok::torch_ops::num(static_cast<int64_t>(needs_flags.size())));
  const Needs needs{needs_flags[0] != 0, needs_flags[1] != 0, needs_flags[2] != 0,
                    needs_flags[3] != 0, needs_flags[4] != 0, needs_flags[5] != 0};
  const int schedule_parts = entry_of_row.has_value() + row_of_entry.has_value() + group_offset.has_value() +
                             group_rows.has_value();
  expect(schedule_parts == 0 || schedule_parts == 4,
         "staged_backward: give all four schedule tensors (entry_of_row, row_of_entry, group_offset, group_rows) "
         "or none");
  expect(expert_ids.dim() == 2 && x.dim() == 2 && w13.dim() == 3,
         "staged_backward: x [T, H], expert_ids [T, k] and w13 [E, 2I, H] expected (got shapes " +
             mok::torch_ops::shape_of(x) + ", " + mok::torch_ops::shape_of(expert_ids) + ", " +
             mok::torch_ops::shape_of(w13) + ")");
  mok::torch_ops::expect_cuda(x.device(), "x");
  const c10::cuda::CUDAGuard guard(x.device());
  const Kernels& k = kernels();
  const int64_t T = x.size(0), top_k = expert_ids.size(1), E = w13.size(0);
  const at::Tensor dout = dout_in.to(x.scalar_type()).contiguous();

  at::Tensor dx_rows, slot_rows, dweights, dw13, dw2;
  if (needs.x || needs.weights || needs.w13 || needs.w2) {  // _routed
    const Schedule s = schedule_parts == 4 ? Schedule{*entry_of_row, *row_of_entry, *group_offset, *group_rows}
                                           : routed_schedule(expert_ids, E);
    const at::Tensor row_of_entry_tk = s.row_of_entry.view({T, top_k});
    // Each token's dout and x rows to its k rows in one pass (x's only where
    // a kernel reads them: dW13, or recompute mode's gate/up GEMM).
    const bool x_rows_needed = !preact.has_value() || needs.w13;
    const std::vector<at::Tensor> sources = x_rows_needed ? std::vector<at::Tensor>{dout, x}
                                                          : std::vector<at::Tensor>{dout};
    const std::vector<at::Tensor> rows = k.scatter_rows.call(sources, row_of_entry_tk, s.entry_of_row, false);
    const at::Tensor& dout_rows = rows[0];
    const at::Tensor x_rows = x_rows_needed ? rows[1] : at::Tensor();
    // One more weight, for the saved schedule's dummy entry (padding rows).
    const at::Tensor flat_weights =
        at::cat({weights.reshape({-1}).to(at::kFloat), at::zeros({1}, weights.options().dtype(at::kFloat))});
    const at::Tensor w_rows = flat_weights.index_select(0, s.entry_of_row).contiguous();
    // _routed_rows
    const at::Tensor gate_up = preact.has_value() ? *preact : k.grouped_mm.call(x_rows, w13, s.group_offset,
                                                                                 s.group_rows);
    auto [d13, hw, dscale] = k.swiglu_backward_mm.call(dout_rows, w2, gate_up, w_rows, s.group_offset,
                                                       s.group_rows, false);
    if (needs.x) dx_rows = k.grouped_mm_kn.call(d13, w13, s.group_offset, s.group_rows, false);
    dw13 = weight_grad(needs.w13, d13, x_rows, main_w13, s.group_offset, s.group_rows, E, grad_dtype);
    dw2 = weight_grad(needs.w2, dout_rows, hw, main_w2, s.group_offset, s.group_rows, E, grad_dtype);
    if (needs.x) slot_rows = row_of_entry_tk.to(at::kInt);
    if (needs.weights) dweights = dscale.index_select(0, s.row_of_entry).view({T, top_k});
  }

  at::Tensor dx_shared, dsw13, dsw2;
  if (shared_w13.has_value() && (needs.x || needs.shared_w13 || needs.shared_w2)) {  // _shared
    expect(shared_w2.has_value(), "staged_backward: shared_w13 given without shared_w2");
    const at::TensorOptions table = x.options().dtype(at::kInt);
    const at::Tensor offset = at::arange(2, table).mul_(T);  // [0, T]
    const at::Tensor one_group = at::full({1}, T, table);
    const at::Tensor sw13 = shared_w13->unsqueeze(0), sw2 = shared_w2->unsqueeze(0);  // one group
    const at::Tensor gate_up =
        shared_preact.has_value() ? *shared_preact : k.grouped_mm.call(x, sw13, offset, one_group);
    auto [d13, h, unused] = k.swiglu_backward_mm.call(dout, sw2, gate_up, std::nullopt, offset, one_group, false);
    if (needs.x) dx_shared = k.grouped_mm_kn.call(d13, sw13, offset, one_group, false);
    dsw13 = weight_grad(needs.shared_w13, d13, x, main_shared_w13, offset, one_group, 1, grad_dtype);
    dsw2 = weight_grad(needs.shared_w2, dout, h, main_shared_w2, offset, one_group, 1, grad_dtype);
    if (dsw13.defined()) dsw13 = dsw13[0];
    if (dsw2.defined()) dsw2 = dsw2[0];
  }

  at::Tensor dx;
  if (needs.x) {
    // The forward's combine order: shared part, then slots 0..k-1, in fp32,
    // one bf16 rounding (one pass over the slot rows).
    dx = k.row_combine.call(dx_rows, slot_rows,
                            dx_shared.defined() ? OptTensor(dx_shared) : OptTensor(std::nullopt))
             .to(x.scalar_type());
  }
  return {dx, dweights, dw13, dw2, dsw13, dsw2};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
  m.def(
      "staged_backward(Tensor dout, Tensor x, Tensor expert_ids, Tensor weights, Tensor w13, Tensor w2, "
      "Tensor? shared_w13, Tensor? shared_w2, Tensor? preact, Tensor? shared_preact, Tensor? entry_of_row, "
      "Tensor? row_of_entry, Tensor? group_offset, Tensor? group_rows, int[] needs, ScalarType? grad_dtype, "
      "Tensor(a!)? main_w13, Tensor(b!)? main_w2, Tensor(c!)? main_shared_w13, Tensor(d!)? main_shared_w2) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) { m.impl("staged_backward", &staged_backward); }
// CPU tensors reach the checks, which refuse them by name (the CPU runs
// layer_backward's Python chain on mok.testing's reference ops instead).
TORCH_LIBRARY_IMPL(mok, CPU, m) { m.impl("staged_backward", &staged_backward); }
