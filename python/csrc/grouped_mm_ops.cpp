// torch.ops.mok.grouped_mm / grouped_mm_swiglu / grouped_mm_kn: the grouped GEMM engine as
// PyTorch custom ops. Tensors are checked here (op_checks.hpp); the engine
// then checks alignment and supported sizes (mok::Error, re-raised as a
// c10::Error). Kernels: CUDA, Meta (shapes only, for fake tensors), CPU
// (refuses, with a message). Errors follow op_errors.hpp.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <string>

#include "mok/grouped_gemm.hpp"
#include "op_checks.hpp"
#include "padding_rows.hpp"
#include "op_errors.hpp"
#include "op_outputs.hpp"

namespace {

using mok::torch_ops::check_tensor;
using mok::torch_ops::expect;
using mok::torch_ops::num;
using mok::torch_ops::shape_of;
using mok::torch_ops::TensorSpec;

const TensorSpec kOperandA{at::kBFloat16, 2, /*aligned=*/true};
const TensorSpec kOperandB{at::kBFloat16, 3, /*aligned=*/true};
const TensorSpec kGroupTable{at::kInt, 1};

// Checks the arguments and returns the output's width n. b is [G, N, K]
// (kNK: nn.Linear's layout; SwiGLU: [G, 2N, K]) or [G, K, N] (kKN).
int64_t check_arguments(const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_offset,
                        const at::Tensor& group_rows, mok::GemmEpilogue epilogue,
                        mok::WeightLayout layout = mok::WeightLayout::kNK) {
  expect(a.defined(), "a is undefined");
  const at::Device device = a.device();
  mok::torch_ops::expect_cuda(device, "a");
  check_tensor(a, "a", kOperandA, device, "a is on");
  check_tensor(b, "b", kOperandB, device, "a is on");
  check_tensor(group_offset, "group_offset", kGroupTable, device, "a is on");
  check_tensor(group_rows, "group_rows", kGroupTable, device, "a is on");
  const int64_t groups = b.size(0);
  const bool swiglu = epilogue == mok::GemmEpilogue::kSwiGLU;
  const bool kn = layout == mok::WeightLayout::kKN;
  expect(a.size(1) == b.size(kn ? 1 : 2), "a is [M, K] = " + shape_of(a) + " but b is " +
                                              (kn ? "[G, K, N] = " : "[G, N, K] = ") + shape_of(b) + ": K differs");
  expect(!swiglu || b.size(1) % 2 == 0, "w13 must be [G, 2N, K] (gate rows then up rows); got " + shape_of(b));
  expect(group_rows.size(0) == groups,
         "group_rows must have G = " + num(groups) + " entries (got " + num(group_rows.size(0)) + ")");
  expect(group_offset.size(0) == groups + 1,
         "group_offset must have G + 1 = " + num(groups + 1) + " entries (got " + num(group_offset.size(0)) + ")");
  mok::torch_ops::checked_int(groups, "the group count G (b.size(0))");
  return kn ? b.size(2) : swiglu ? b.size(1) / 2 : b.size(1);
}

// The arguments every variant shares: operands, output, group table, sizes.
mok::GroupedGemmArgs common_args(const at::Tensor& a, const at::Tensor& b, at::Tensor& out,
                                 const at::Tensor& group_offset, const at::Tensor& group_rows, int64_t n) {
  mok::GroupedGemmArgs args;
  args.a = a.data_ptr();
  args.b = b.data_ptr();
  args.out = out.data_ptr();
  args.group_offset = group_offset.data_ptr<int32_t>();
  args.group_rows = group_rows.data_ptr<int32_t>();
  args.num_groups = static_cast<int>(b.size(0));
  args.m_total = a.size(0);
  args.n = n;
  args.k = a.size(1);
  return args;
}

void enqueue(const mok::GroupedGemmArgs& args, const at::Device& device) {
  mok::torch_ops::raising_torch_errors(
      [&] { mok::grouped_gemm(args, c10::cuda::getCurrentCUDAStream(device.index()).stream()); });
}

// kKN outputs are zeros on rows no group owns (they are data gradients,
// whose padding rows a caller may sum) unless the caller says it never reads
// them (zero_padding false: the staged backward); the forward's outputs
// leave them. Under torch's deterministic fill they are cleared either way
// (op_outputs.hpp).
at::Tensor run(const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_offset,
               const at::Tensor& group_rows, mok::GemmEpilogue epilogue,
               mok::WeightLayout layout = mok::WeightLayout::kNK, bool zero_padding = false) {
  const int64_t n = check_arguments(a, b, group_offset, group_rows, epilogue, layout);
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor out = mok::torch_ops::written_output({a.size(0), n}, a.options());
  if (a.size(0) == 0) return out;
  mok::GroupedGemmArgs args = common_args(a, b, out, group_offset, group_rows, n);
  args.epilogue = epilogue;
  args.b_layout = layout;
  enqueue(args, a.device());
  if (mok::torch_ops::clear_unwritten_rows(zero_padding)) {
    mok::torch_ops::zero_padding_rows(out, group_offset, group_rows);
  }
  return out;
}

at::Tensor meta(const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_offset,
                const at::Tensor& group_rows, mok::GemmEpilogue epilogue,
                mok::WeightLayout layout = mok::WeightLayout::kNK) {
  const int64_t n = check_arguments(a, b, group_offset, group_rows, epilogue, layout);
  return at::empty({a.size(0), n}, a.options());
}

at::Tensor grouped_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_offset,
                      const at::Tensor& group_rows) {
  return run(a, b, group_offset, group_rows, mok::GemmEpilogue::kPlain);
}

at::Tensor grouped_mm_swiglu(const at::Tensor& a, const at::Tensor& w13, const at::Tensor& group_offset,
                             const at::Tensor& group_rows) {
  return run(a, w13, group_offset, group_rows, mok::GemmEpilogue::kSwiGLU);
}

// b [G, K, N]: a data gradient's weights as stored (dx = dy . W).
at::Tensor grouped_mm_kn(const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_offset,
                         const at::Tensor& group_rows, bool zero_padding) {
  return run(a, b, group_offset, group_rows, mok::GemmEpilogue::kPlain, mok::WeightLayout::kKN, zero_padding);
}

at::Tensor grouped_mm_kn_meta(const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_offset,
                              const at::Tensor& group_rows, bool /*zero_padding*/) {
  return meta(a, b, group_offset, group_rows, mok::GemmEpilogue::kPlain, mok::WeightLayout::kKN);
}

at::Tensor grouped_mm_meta(const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_offset,
                           const at::Tensor& group_rows) {
  return meta(a, b, group_offset, group_rows, mok::GemmEpilogue::kPlain);
}

at::Tensor grouped_mm_swiglu_meta(const at::Tensor& a, const at::Tensor& w13, const at::Tensor& group_offset,
                                  const at::Tensor& group_rows) {
  return meta(a, w13, group_offset, group_rows, mok::GemmEpilogue::kSwiGLU);
}

// ---- grouped_mm_fp8: block-scaled e4m3 operands -> bf16 ---------------------

const TensorSpec kFp8Rows{at::kFloat8_e4m3fn, 2, /*aligned=*/true};
const TensorSpec kFp8Weights{at::kFloat8_e4m3fn, 3, /*aligned=*/true};

// a [M, K] and b [G, N, K] float8_e4m3fn with ue8m0 (uint8) scales a_scales
// [M, K / 128] and b_scales [G, N / 128, K / 128]; returns the output width
// (N, or N / 2 for SwiGLU, whose b is w13 [G, 2I, K]).
int64_t check_fp8(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& b, const at::Tensor& b_scales,
                  const at::Tensor& group_offset, const at::Tensor& group_rows, bool swiglu = false) {
  expect(a.defined(), "a is undefined");
  const at::Device device = a.device();
  mok::torch_ops::expect_cuda(device, "a");
  check_tensor(a, "a", kFp8Rows, device, "a is on");
  check_tensor(b, "b", kFp8Weights, device, "a is on");
  check_tensor(a_scales, "a_scales", TensorSpec{at::kByte, 2}, device, "a is on");
  check_tensor(b_scales, "b_scales", TensorSpec{at::kByte, 3}, device, "a is on");
  check_tensor(group_offset, "group_offset", kGroupTable, device, "a is on");
  check_tensor(group_rows, "group_rows", kGroupTable, device, "a is on");
  const int64_t M = a.size(0), K = a.size(1), G = b.size(0), N = b.size(1);
  expect(b.size(2) == K, "a is [M, K] = " + shape_of(a) + " but b is [G, N, K] = " + shape_of(b) + ": K differs");
  expect(K % 128 == 0 && N % 128 == 0, "K = " + num(K) + " and " + (swiglu ? "2I = " : "N = ") + num(N) +
                                           " must be multiples of 128");
  mok::torch_ops::check_shape(a_scales, "a_scales", {M, K / 128}, "[M, K / 128]");
  mok::torch_ops::check_shape(b_scales, "b_scales", {G, N / 128, K / 128}, "[G, N / 128, K / 128]");
  expect(group_rows.size(0) == G && group_offset.size(0) == G + 1,
         "group_offset and group_rows must have G + 1 and G = " + num(G) + " entries");
  mok::torch_ops::checked_int(G, "the group count G (b.size(0))");
  return swiglu ? N / 2 : N;
}

at::Tensor run_fp8(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& b, const at::Tensor& b_scales,
                   const at::Tensor& group_offset, const at::Tensor& group_rows, bool swiglu) {
  const int64_t n = check_fp8(a, a_scales, b, b_scales, group_offset, group_rows, swiglu);
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor out = mok::torch_ops::written_output({a.size(0), n}, a.options().dtype(at::kBFloat16));
  if (a.size(0) == 0) return out;
  mok::GroupedGemmArgs args = common_args(a, b, out, group_offset, group_rows, n);
  args.element = mok::GemmElement::kE4M3;
  args.a_scales = a_scales.data_ptr<uint8_t>();
  args.b_scales = b_scales.data_ptr<uint8_t>();
  args.epilogue = swiglu ? mok::GemmEpilogue::kSwiGLU : mok::GemmEpilogue::kPlain;
  enqueue(args, a.device());
  if (mok::torch_ops::clear_unwritten_rows(false)) mok::torch_ops::zero_padding_rows(out, group_offset, group_rows);
  return out;
}

at::Tensor meta_fp8(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& b, const at::Tensor& b_scales,
                    const at::Tensor& group_offset, const at::Tensor& group_rows, bool swiglu) {
  const int64_t n = check_fp8(a, a_scales, b, b_scales, group_offset, group_rows, swiglu);
  return at::empty({a.size(0), n}, a.options().dtype(at::kBFloat16));
}

at::Tensor grouped_mm_fp8(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& b,
                          const at::Tensor& b_scales, const at::Tensor& group_offset, const at::Tensor& group_rows) {
  return run_fp8(a, a_scales, b, b_scales, group_offset, group_rows, false);
}
at::Tensor grouped_mm_fp8_swiglu(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& w13,
                                 const at::Tensor& w13_scales, const at::Tensor& group_offset,
                                 const at::Tensor& group_rows) {
  return run_fp8(a, a_scales, w13, w13_scales, group_offset, group_rows, true);
}
at::Tensor grouped_mm_fp8_meta(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& b,
                               const at::Tensor& b_scales, const at::Tensor& group_offset,
                               const at::Tensor& group_rows) {
  return meta_fp8(a, a_scales, b, b_scales, group_offset, group_rows, false);
}
at::Tensor grouped_mm_fp8_swiglu_meta(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& w13,
                                      const at::Tensor& w13_scales, const at::Tensor& group_offset,
                                      const at::Tensor& group_rows) {
  return meta_fp8(a, a_scales, w13, w13_scales, group_offset, group_rows, true);
}

}  // namespace

TORCH_LIBRARY(mok, m) {
  m.def("grouped_mm(Tensor a, Tensor b, Tensor group_offset, Tensor group_rows) -> Tensor");
  m.def("grouped_mm_swiglu(Tensor a, Tensor w13, Tensor group_offset, Tensor group_rows) -> Tensor");
  m.def("grouped_mm_kn(Tensor a, Tensor b, Tensor group_offset, Tensor group_rows, *, bool zero_padding=True) "
        "-> Tensor");
  m.def("grouped_mm_fp8(Tensor a, Tensor a_scales, Tensor b, Tensor b_scales, Tensor group_offset, "
        "Tensor group_rows) -> Tensor");
  m.def("grouped_mm_fp8_swiglu(Tensor a, Tensor a_scales, Tensor w13, Tensor w13_scales, Tensor group_offset, "
        "Tensor group_rows) -> Tensor");
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) {
  m.impl("grouped_mm", &grouped_mm);
  m.impl("grouped_mm_swiglu", &grouped_mm_swiglu);
  m.impl("grouped_mm_kn", &grouped_mm_kn);
  m.impl("grouped_mm_fp8", &grouped_mm_fp8);
  m.impl("grouped_mm_fp8_swiglu", &grouped_mm_fp8_swiglu);
}

TORCH_LIBRARY_IMPL(mok, Meta, m) {
  m.impl("grouped_mm", &grouped_mm_meta);
  m.impl("grouped_mm_swiglu", &grouped_mm_swiglu_meta);
  m.impl("grouped_mm_kn", &grouped_mm_kn_meta);
  m.impl("grouped_mm_fp8", &grouped_mm_fp8_meta);
  m.impl("grouped_mm_fp8_swiglu", &grouped_mm_fp8_swiglu_meta);
}

// CPU tensors reach the same checks, which refuse them by name.
TORCH_LIBRARY_IMPL(mok, CPU, m) {
  m.impl("grouped_mm", &grouped_mm);
  m.impl("grouped_mm_swiglu", &grouped_mm_swiglu);
  m.impl("grouped_mm_kn", &grouped_mm_kn);
  m.impl("grouped_mm_fp8", &grouped_mm_fp8);
  m.impl("grouped_mm_fp8_swiglu", &grouped_mm_fp8_swiglu);
}
