// torch.ops.mok.grouped_mm / grouped_mm_swiglu: the grouped GEMM engine as
// PyTorch custom ops. Tensors are checked here (dtype, device, contiguity,
// shapes) with messages that name the argument; the engine then checks
// alignment and supported sizes (mok::Error, surfaced as RuntimeError).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <string>

#include "mok/error.hpp"
#include "mok/grouped_gemm.hpp"

namespace {

void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dim,
                  const at::Device& device) {
  TORCH_CHECK(t.defined(), "mok: ", name, " is undefined");
  TORCH_CHECK(t.is_cuda(), "mok: ", name, " must be a CUDA tensor (got ", t.device(), ")");
  TORCH_CHECK(t.device() == device, "mok: ", name, " is on ", t.device(), " but a is on ", device);
  TORCH_CHECK(t.scalar_type() == dtype, "mok: ", name, " must be ", dtype, " (got ", t.scalar_type(), ")");
  TORCH_CHECK(t.dim() == dim, "mok: ", name, " must have ", dim, " dimensions (got shape ", t.sizes(), ")");
  TORCH_CHECK(t.is_contiguous(), "mok: ", name, " must be contiguous");
}

at::Tensor run(const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_offset,
               const at::Tensor& group_rows, mok::GemmEpilogue epilogue) {
  TORCH_CHECK(a.defined() && a.is_cuda(), "mok: a must be a CUDA tensor");
  const at::Device device = a.device();
  check_tensor(a, "a", at::kBFloat16, 2, device);
  check_tensor(b, "b", at::kBFloat16, 3, device);
  check_tensor(group_offset, "group_offset", at::kInt, 1, device);
  check_tensor(group_rows, "group_rows", at::kInt, 1, device);
  const int64_t groups = b.size(0);
  const bool swiglu = epilogue == mok::GemmEpilogue::kSwiGLU;
  TORCH_CHECK(a.size(1) == b.size(2), "mok: a is [M, K] = ", a.sizes(), " but b is [G, N, K] = ",
              b.sizes(), ": K differs");
  TORCH_CHECK(!swiglu || b.size(1) % 2 == 0, "mok: w13 must be [G, 2N, K] (gate rows then up rows); got ",
              b.sizes());
  TORCH_CHECK(group_rows.size(0) == groups, "mok: group_rows must have G = ", groups, " entries (got ",
              group_rows.size(0), ")");
  TORCH_CHECK(group_offset.size(0) == groups + 1, "mok: group_offset must have G + 1 = ", groups + 1,
              " entries (got ", group_offset.size(0), ")");
  const int64_t n = swiglu ? b.size(1) / 2 : b.size(1);

  const c10::cuda::CUDAGuard guard(device);
  at::Tensor out = at::empty({a.size(0), n}, a.options());
  if (a.size(0) == 0) return out;
  mok::GroupedGemmArgs args;
  args.a = a.data_ptr();
  args.b = b.data_ptr();
  args.out = out.data_ptr();
  args.group_offset = group_offset.data_ptr<int32_t>();
  args.group_rows = group_rows.data_ptr<int32_t>();
  args.num_groups = static_cast<int>(groups);
  TORCH_CHECK(groups == args.num_groups, "mok: too many groups: ", groups);
  args.m_total = a.size(0);
  args.n = n;
  args.k = a.size(1);
  args.epilogue = epilogue;
  try {
    mok::grouped_gemm(args, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  } catch (const mok::Error& e) {
    TORCH_CHECK(false, e.what());
  }
  return out;
}

at::Tensor grouped_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_offset,
                      const at::Tensor& group_rows) {
  return run(a, b, group_offset, group_rows, mok::GemmEpilogue::kPlain);
}

at::Tensor grouped_mm_swiglu(const at::Tensor& a, const at::Tensor& w13, const at::Tensor& group_offset,
                             const at::Tensor& group_rows) {
  return run(a, w13, group_offset, group_rows, mok::GemmEpilogue::kSwiGLU);
}

}  // namespace

TORCH_LIBRARY(mok, m) {
  m.def("grouped_mm(Tensor a, Tensor b, Tensor group_offset, Tensor group_rows) -> Tensor");
  m.def("grouped_mm_swiglu(Tensor a, Tensor w13, Tensor group_offset, Tensor group_rows) -> Tensor");
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) {
  m.impl("grouped_mm", &grouped_mm);
  m.impl("grouped_mm_swiglu", &grouped_mm_swiglu);
}
