// torch.ops.mok.quantize_rows_fp8 and grouped_mm_fp8_swiglu_quantize: the
// FP8 forward's two quantizing kernels as custom ops.
//   quantize_rows_fp8(x bf16 [M, K]) -> (values float8_e4m3fn [M, K], scales uint8 [M, K / 128])
//     include/mok/fp8.hpp's rule, bit for bit (mok.quant.quantize_rows is the
//     Python twin and calls this on CUDA);
//   grouped_mm_fp8_swiglu_quantize(a, a_scales, w13, w13_scales, group_offset, group_rows)
//     -> (h values float8_e4m3fn [M, I], h scales uint8 [M, I / 128]): the FP8
//     gate/up with h = silu(gate) * up quantized from fp32 in the epilogue
//     (GemmEpilogue::kSwiGLUQuantize); rows outside every group are left as
//     allocated (uninitialised), as in grouped_mm_fp8.
// CUDA and Meta kernels; CPU tensors are refused by name (the staged FP8
// forward's CPU path uses torch references, mok/fp8_forward.py).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "mok/grouped_gemm.hpp"
#include "mok/quantize_rows.hpp"
#include "op_checks.hpp"
#include "op_errors.hpp"

namespace {

using mok::torch_ops::check_tensor;
using mok::torch_ops::expect;
using mok::torch_ops::num;
using mok::torch_ops::shape_of;
using mok::torch_ops::TensorSpec;

CUstream_st* current_stream(const at::Device& device) {
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
}

// ---- quantize_rows_fp8 -------------------------------------------------------

void check_rows(const at::Tensor& x) {
  expect(x.defined(), "x is undefined");
  mok::torch_ops::expect_cuda(x.device(), "x");
  check_tensor(x, "x", TensorSpec{at::kBFloat16, 2, /*aligned=*/true}, x.device(), "x is on");
  expect(x.size(1) % 128 == 0 && x.size(1) > 0, "x is " + shape_of(x) + ": its columns must be a positive multiple "
                                                "of 128 (one scale per 128)");
}

std::tuple<at::Tensor, at::Tensor> quantize_rows_fp8(const at::Tensor& x) {
  check_rows(x);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor values = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scales = at::empty({x.size(0), x.size(1) / 128}, x.options().dtype(at::kByte));
  mok::QuantizeRowsArgs args;
  args.x = x.data_ptr();
  args.values = static_cast<uint8_t*>(values.data_ptr());
  args.scales = scales.data_ptr<uint8_t>();
  args.rows = x.size(0);
  args.cols = x.size(1);
  mok::torch_ops::raising_torch_errors([&] { mok::quantize_rows_e4m3(args, current_stream(x.device())); });
  return {values, scales};
}

std::tuple<at::Tensor, at::Tensor> quantize_rows_fp8_meta(const at::Tensor& x) {
  check_rows(x);
  return {at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn)),
          at::empty({x.size(0), x.size(1) / 128}, x.options().dtype(at::kByte))};
}

// ---- grouped_mm_fp8_swiglu_quantize -------------------------------------------

// a [M, K], w13 [G, 2I, K] float8_e4m3fn with their ue8m0 scales; returns I.
int64_t check_swiglu_quantize(const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& w13,
                              const at::Tensor& w13_scales, const at::Tensor& group_offset,
                              const at::Tensor& group_rows) {
  expect(a.defined(), "a is undefined");
  const at::Device device = a.device();
  mok::torch_ops::expect_cuda(device, "a");
  check_tensor(a, "a", TensorSpec{at::kFloat8_e4m3fn, 2, true}, device, "a is on");
  check_tensor(w13, "w13", TensorSpec{at::kFloat8_e4m3fn, 3, true}, device, "a is on");
  check_tensor(a_scales, "a_scales", TensorSpec{at::kByte, 2}, device, "a is on");
  check_tensor(w13_scales, "w13_scales", TensorSpec{at::kByte, 3}, device, "a is on");
  check_tensor(group_offset, "group_offset", TensorSpec{at::kInt, 1}, device, "a is on");
  check_tensor(group_rows, "group_rows", TensorSpec{at::kInt, 1}, device, "a is on");
  const int64_t M = a.size(0), K = a.size(1), G = w13.size(0), N2 = w13.size(1);
  expect(w13.size(2) == K, "a is [M, K] = " + shape_of(a) + " but w13 is [G, 2I, K] = " + shape_of(w13) +
                               ": K differs");
  expect(K % 128 == 0 && N2 % 256 == 0, "K = " + num(K) + " must be a multiple of 128 and 2I = " + num(N2) +
                                            " of 256 (one h scale per 128 columns)");
  mok::torch_ops::check_shape(a_scales, "a_scales", {M, K / 128}, "[M, K / 128]");
  mok::torch_ops::check_shape(w13_scales, "w13_scales", {G, N2 / 128, K / 128}, "[G, 2I / 128, K / 128]");
  expect(group_rows.size(0) == G && group_offset.size(0) == G + 1,
         "group_offset and group_rows must have G + 1 and G = " + num(G) + " entries");
  mok::torch_ops::checked_int(G, "the group count G (w13.size(0))");
  return N2 / 2;
}

std::tuple<at::Tensor, at::Tensor> grouped_mm_fp8_swiglu_quantize(const at::Tensor& a, const at::Tensor& a_scales,
                                                                  const at::Tensor& w13, const at::Tensor& w13_scales,
                                                                  const at::Tensor& group_offset,
                                                                  const at::Tensor& group_rows) {
  const int64_t I = check_swiglu_quantize(a, a_scales, w13, w13_scales, group_offset, group_rows);
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor values = at::empty({a.size(0), I}, a.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scales = at::empty({a.size(0), I / 128}, a.options().dtype(at::kByte));
  if (a.size(0) == 0) return {values, scales};
  mok::GroupedGemmArgs args;
  args.element = mok::GemmElement::kE4M3;
  args.epilogue = mok::GemmEpilogue::kSwiGLUQuantize;
  args.a = a.data_ptr();
  args.a_scales = static_cast<const uint8_t*>(a_scales.data_ptr());
  args.b = w13.data_ptr();
  args.b_scales = static_cast<const uint8_t*>(w13_scales.data_ptr());
  args.out = values.data_ptr();
  args.out_scales = scales.data_ptr<uint8_t>();
  args.group_offset = group_offset.data_ptr<int32_t>();
  args.group_rows = group_rows.data_ptr<int32_t>();
  args.num_groups = static_cast<int>(w13.size(0));
  args.m_total = a.size(0);
  args.n = I;
  args.k = a.size(1);
  mok::torch_ops::raising_torch_errors([&] { mok::grouped_gemm(args, current_stream(a.device())); });
  return {values, scales};
}

std::tuple<at::Tensor, at::Tensor> grouped_mm_fp8_swiglu_quantize_meta(
    const at::Tensor& a, const at::Tensor& a_scales, const at::Tensor& w13, const at::Tensor& w13_scales,
    const at::Tensor& group_offset, const at::Tensor& group_rows) {
  const int64_t I = check_swiglu_quantize(a, a_scales, w13, w13_scales, group_offset, group_rows);
  return {at::empty({a.size(0), I}, a.options().dtype(at::kFloat8_e4m3fn)),
          at::empty({a.size(0), I / 128}, a.options().dtype(at::kByte))};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
  m.def("quantize_rows_fp8(Tensor x) -> (Tensor, Tensor)");
  m.def("grouped_mm_fp8_swiglu_quantize(Tensor a, Tensor a_scales, Tensor w13, Tensor w13_scales, "
        "Tensor group_offset, Tensor group_rows) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) {
  m.impl("quantize_rows_fp8", &quantize_rows_fp8);
  m.impl("grouped_mm_fp8_swiglu_quantize", &grouped_mm_fp8_swiglu_quantize);
}

TORCH_LIBRARY_IMPL(mok, Meta, m) {
  m.impl("quantize_rows_fp8", &quantize_rows_fp8_meta);
  m.impl("grouped_mm_fp8_swiglu_quantize", &grouped_mm_fp8_swiglu_quantize_meta);
}

// CPU tensors reach the same checks, which refuse them by name.
TORCH_LIBRARY_IMPL(mok, CPU, m) {
  m.impl("quantize_rows_fp8", &quantize_rows_fp8);
  m.impl("grouped_mm_fp8_swiglu_quantize", &grouped_mm_fp8_swiglu_quantize);
}
