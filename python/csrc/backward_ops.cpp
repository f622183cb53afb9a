// The backward's building blocks as PyTorch custom ops (the staged backward,
// python/mok/staged_backward.py, chains them; the fused backward will replace
// the chain, docs/backward-design.md; grouped_mm_kn, the data gradient's
// GEMM, is with grouped_mm in grouped_mm_ops.cpp):
//   mok::swiglu_backward_mm   the data gradient through the down projection and SwiGLU
//   mok::weight_grad_mm(_acc_) out[g] (+)= sum over group g's rows of a[r]^T b[r], fp32
// Tensors are checked here (op_checks.hpp); the engine then checks alignment
// and supported sizes (mok::Error, re-raised as a c10::Error). Kernels: CUDA,
// Meta (shapes only, for fake tensors), CPU (refuses, with a message).
// Errors follow op_errors.hpp.
//
// Unlike grouped_mm's padding rows (left unwritten), every bf16/fp32 row
// output here is zero on rows no group owns (the kernels write only the rows
// inside a group; the rest is cleared after): a gradient must be defined
// everywhere (a padding row's gradient is zero, and a stale NaN there would
// poison a later sum). swiglu_backward_mm's zero_padding=False leaves its
// bf16 outputs' padding rows uninitialised, for a caller that never reads
// them (the staged backward: its grouped kernels read a group's real rows
// only, and the weight gradient clears a group's last rows in shared memory).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

#include "mok/grouped_gemm.hpp"
#include "mok/weight_grad.hpp"
#include "op_checks.hpp"
#include "padding_rows.hpp"
#include "op_errors.hpp"
#include "op_outputs.hpp"

namespace {

using mok::torch_ops::check_group_tables;
using mok::torch_ops::check_shape;
using mok::torch_ops::check_tensor;
using mok::torch_ops::checked_int;
using mok::torch_ops::expect;
using mok::torch_ops::num;
using mok::torch_ops::shape_of;
using mok::torch_ops::TensorSpec;

// bf16 operands are read by TMA (16-byte aligned); the fp32 weight gradient
// is written in 16-byte units too.
const TensorSpec kRows{at::kBFloat16, 2, /*aligned=*/true};
const TensorSpec kWeights{at::kBFloat16, 3, /*aligned=*/true};
const TensorSpec kRowScale{at::kFloat, 1};
const TensorSpec kGradOut{at::kFloat, 3, /*aligned=*/true};
const TensorSpec kGradOutBf16{at::kBFloat16, 3, /*aligned=*/true};

CUstream_st* current_stream(const at::Device& device) {
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
}

// ---- swiglu_backward_mm ----------------------------------------------------
// dout_rows [M, H], w2 [G, H, I] (nn.Linear's layout of the down projection,
// read as b [G, k = H, n = I] with kKN), preact [M, 2I] ([gate | up]),
// row_scale [M] or None -> d13 [M, 2I] bf16, scaled_act [M, I] bf16,
// row_scale_grad [M] fp32 (include/mok/grouped_gemm.hpp has the math).

using SwigluGrads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// Checks the arguments and returns I.
int64_t check_swiglu_backward(const at::Tensor& dout_rows, const at::Tensor& w2, const at::Tensor& preact,
                              const std::optional<at::Tensor>& row_scale, const at::Tensor& group_offset,
                              const at::Tensor& group_rows) {
  expect(dout_rows.defined(), "dout_rows is undefined");
  const at::Device device = dout_rows.device();
  mok::torch_ops::expect_cuda(device, "dout_rows");
  check_tensor(dout_rows, "dout_rows", kRows, device, "dout_rows is on");
  check_tensor(w2, "w2", kWeights, device, "dout_rows is on");
  check_tensor(preact, "preact", kRows, device, "dout_rows is on");
  const int64_t M = dout_rows.size(0), H = dout_rows.size(1), I = w2.size(2);
  expect(w2.size(1) == H, "dout_rows is [M, H] = " + shape_of(dout_rows) + " but w2 is [G, H, I] = " +
                              shape_of(w2) + ": H differs");
  check_shape(preact, "preact", {M, 2 * I}, "[M, 2I] (M from dout_rows, I from w2)");
  if (row_scale.has_value() && row_scale->defined()) {
    check_tensor(*row_scale, "row_scale", kRowScale, device, "dout_rows is on");
    check_shape(*row_scale, "row_scale", {M}, "[M] (M from dout_rows)");
  }
  check_group_tables(group_offset, group_rows, w2.size(0), device, "dout_rows is on");
  checked_int(w2.size(0), "the group count G (w2.size(0))");
  return I;
}

SwigluGrads swiglu_backward_mm(const at::Tensor& dout_rows, const at::Tensor& w2, const at::Tensor& preact,
                               const std::optional<at::Tensor>& row_scale, const at::Tensor& group_offset,
                               const at::Tensor& group_rows, bool zero_padding) {
  const int64_t I = check_swiglu_backward(dout_rows, w2, preact, row_scale, group_offset, group_rows);
  const c10::cuda::CUDAGuard guard(dout_rows.device());
  const int64_t M = dout_rows.size(0);
  at::Tensor d13 = mok::torch_ops::written_output({M, 2 * I}, dout_rows.options());
  at::Tensor scaled_act = mok::torch_ops::written_output({M, I}, dout_rows.options());
  at::Tensor row_scale_grad = mok::torch_ops::zeros_output({M}, dout_rows.options().dtype(at::kFloat));
  if (M == 0) return {d13, scaled_act, row_scale_grad};
  // The per-n-tile parts of <acc, h>: written for every row inside a group,
  // before the second kernel reduces them in n-tile order.
  const int64_t parts = mok::torch_ops::raising_torch_errors([&] { return mok::swiglu_backward_parts(I); });
  at::Tensor scratch = mok::torch_ops::written_output({M, parts}, dout_rows.options().dtype(at::kFloat));
  const bool scaled = row_scale.has_value() && row_scale->defined();
  mok::GroupedGemmArgs args;
  args.a = dout_rows.data_ptr();
  args.b = w2.data_ptr();
  args.out = d13.data_ptr();
  args.group_offset = group_offset.data_ptr<int32_t>();
  args.group_rows = group_rows.data_ptr<int32_t>();
  args.num_groups = static_cast<int>(w2.size(0));
  args.m_total = M;
  args.n = I;
  args.k = dout_rows.size(1);
  args.epilogue = mok::GemmEpilogue::kSwiGLUBackward;
  args.b_layout = mok::WeightLayout::kKN;
  args.preact = preact.data_ptr();
  args.row_scale = scaled ? row_scale->data_ptr<float>() : nullptr;
  args.scaled_act = scaled_act.data_ptr();
  args.row_scale_grad = row_scale_grad.data_ptr<float>();
  args.scratch = scratch.data_ptr<float>();
  mok::torch_ops::raising_torch_errors([&] { mok::grouped_gemm(args, current_stream(dout_rows.device())); });
  if (mok::torch_ops::clear_unwritten_rows(zero_padding)) {
    mok::torch_ops::zero_padding_rows(d13, group_offset, group_rows);
    mok::torch_ops::zero_padding_rows(scaled_act, group_offset, group_rows);
  }
  return {d13, scaled_act, row_scale_grad};
}

SwigluGrads swiglu_backward_mm_meta(const at::Tensor& dout_rows, const at::Tensor& w2, const at::Tensor& preact,
                                    const std::optional<at::Tensor>& row_scale, const at::Tensor& group_offset,
                                    const at::Tensor& group_rows, bool /*zero_padding*/) {
  const int64_t I = check_swiglu_backward(dout_rows, w2, preact, row_scale, group_offset, group_rows);
  const int64_t M = dout_rows.size(0);
  return {at::empty({M, 2 * I}, dout_rows.options()), at::empty({M, I}, dout_rows.options()),
          at::empty({M}, dout_rows.options().dtype(at::kFloat))};
}

// ---- weight_grad_mm: out[g] (+)= sum_r a[r]^T b[r] -------------------------

// a [M, m] and b [M, n], bf16, on `device` (the op's first tensor's).
void check_weight_grad_operands(const at::Tensor& a, const at::Tensor& b, const at::Device& device,
                                const std::string& device_is) {
  check_tensor(a, "a", kRows, device, device_is);
  check_tensor(b, "b", kRows, device, device_is);
  expect(a.size(0) == b.size(0), "a is [M, m] = " + shape_of(a) + " but b is [M, n] = " + shape_of(b) +
                                     ": their row counts M differ");
}

void launch_weight_grad(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_offset,
                        const at::Tensor& group_rows, bool accumulate) {
  mok::WeightGradArgs args;
  args.a = a.data_ptr();
  args.b = b.data_ptr();
  if (out.scalar_type() == at::kBFloat16) {
    args.out_bf16 = out.data_ptr();
  } else {
    args.out = out.data_ptr<float>();
  }
  args.group_offset = group_offset.data_ptr<int32_t>();
  args.group_rows = group_rows.data_ptr<int32_t>();
  args.num_groups = static_cast<int>(out.size(0));
  args.m_total = a.size(0);
  args.m = a.size(1);
  args.n = b.size(1);
  args.accumulate = accumulate;
  mok::torch_ops::raising_torch_errors([&] { mok::grouped_weight_grad(args, current_stream(out.device())); });
}

void check_weight_grad(const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_offset,
                       const at::Tensor& group_rows, int64_t num_groups) {
  expect(a.defined(), "a is undefined");
  const at::Device device = a.device();
  mok::torch_ops::expect_cuda(device, "a");
  check_weight_grad_operands(a, b, device, "a is on");
  expect(num_groups >= 1, "num_groups = " + num(num_groups) + " must be >= 1");
  checked_int(num_groups, "num_groups");
  check_group_tables(group_offset, group_rows, num_groups, device, "a is on");
}

// fp32 (the default) or bf16: the fp32 sum rounded once, what a bf16 weight's
// gradient is, without an fp32 tensor and a conversion pass.
at::ScalarType weight_grad_dtype(std::optional<at::ScalarType> out_dtype) {
  const at::ScalarType t = out_dtype.value_or(at::kFloat);
  expect(t == at::kFloat || t == at::kBFloat16,
         std::string("out_dtype = ") + c10::toString(t) + ": weight_grad_mm writes float32 or bfloat16");
  return t;
}

at::Tensor weight_grad_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_offset,
                          const at::Tensor& group_rows, int64_t num_groups, std::optional<at::ScalarType> out_dtype) {
  check_weight_grad(a, b, group_offset, group_rows, num_groups);
  const at::ScalarType dtype = weight_grad_dtype(out_dtype);
  const c10::cuda::CUDAGuard guard(a.device());
  // The kernel writes every group (zeros for one without rows); with no rows
  // at all nothing is launched, so the zeros come from here.
  if (a.size(0) == 0) return mok::torch_ops::zeros_output({num_groups, a.size(1), b.size(1)}, a.options().dtype(dtype));
  at::Tensor out = mok::torch_ops::written_output({num_groups, a.size(1), b.size(1)}, a.options().dtype(dtype));
  launch_weight_grad(out, a, b, group_offset, group_rows, /*accumulate=*/false);
  return out;
}

at::Tensor weight_grad_mm_meta(const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_offset,
                               const at::Tensor& group_rows, int64_t num_groups,
                               std::optional<at::ScalarType> out_dtype) {
  check_weight_grad(a, b, group_offset, group_rows, num_groups);
  return at::empty({num_groups, a.size(1), b.size(1)}, a.options().dtype(weight_grad_dtype(out_dtype)));
}

void check_weight_grad_acc(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                           const at::Tensor& group_offset, const at::Tensor& group_rows) {
  expect(out.defined(), "out is undefined");
  const at::Device device = out.device();
  mok::torch_ops::expect_cuda(device, "out");
  // fp32 (a main_grad: one fp32 addition) or bf16 (a bf16 weight's .grad:
  // the sum rounded, then added and rounded again, as torch's own
  // accumulation of a bf16 gradient does).
  expect(out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16,
         std::string("out must be float32 (a main_grad) or bfloat16 (a bf16 weight's .grad) (got ") +
             c10::toString(out.scalar_type()) + ")");
  check_tensor(out, "out", out.scalar_type() == at::kBFloat16 ? kGradOutBf16 : kGradOut, device, "out is on");
  check_weight_grad_operands(a, b, device, "out is on");
  const int64_t groups = out.size(0);
  check_shape(out, "out", {groups, a.size(1), b.size(1)}, "[G, m, n] (m from a, n from b)");
  checked_int(groups, "the group count G (out.size(0))");
  check_group_tables(group_offset, group_rows, groups, device, "out is on");
}

void weight_grad_mm_acc(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_offset,
                        const at::Tensor& group_rows) {
  check_weight_grad_acc(out, a, b, group_offset, group_rows);
  if (a.size(0) == 0 || out.size(0) == 0) return;  // nothing to add
  const c10::cuda::CUDAGuard guard(out.device());
  launch_weight_grad(out, a, b, group_offset, group_rows, /*accumulate=*/true);
}

void weight_grad_mm_acc_meta(at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                             const at::Tensor& group_offset, const at::Tensor& group_rows) {
  check_weight_grad_acc(out, a, b, group_offset, group_rows);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
  m.def(
      "swiglu_backward_mm(Tensor dout_rows, Tensor w2, Tensor preact, Tensor? row_scale, Tensor group_offset, "
      "Tensor group_rows, *, bool zero_padding=True) -> (Tensor d13, Tensor scaled_act, Tensor row_scale_grad)");
  m.def("weight_grad_mm(Tensor a, Tensor b, Tensor group_offset, Tensor group_rows, int num_groups, "
        "ScalarType? out_dtype=None) -> Tensor");
  m.def(
      "weight_grad_mm_acc_(Tensor(a!) out, Tensor a, Tensor b, Tensor group_offset, Tensor group_rows) -> ()");
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) {
  m.impl("swiglu_backward_mm", &swiglu_backward_mm);
  m.impl("weight_grad_mm", &weight_grad_mm);
  m.impl("weight_grad_mm_acc_", &weight_grad_mm_acc);
}

TORCH_LIBRARY_IMPL(mok, Meta, m) {
  m.impl("swiglu_backward_mm", &swiglu_backward_mm_meta);
  m.impl("weight_grad_mm", &weight_grad_mm_meta);
  m.impl("weight_grad_mm_acc_", &weight_grad_mm_acc_meta);
}

// CPU tensors reach the same checks, which refuse them by name.
TORCH_LIBRARY_IMPL(mok, CPU, m) {
  m.impl("swiglu_backward_mm", &swiglu_backward_mm);
  m.impl("weight_grad_mm", &weight_grad_mm);
  m.impl("weight_grad_mm_acc_", &weight_grad_mm_acc);
}
