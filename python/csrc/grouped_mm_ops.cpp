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

// Messages are formatted here into one std::string and handed to torch as a
// const char*: streaming integers or shapes into TORCH_CHECK segfaulted on
// the device machine (torch 2.11, cause not established), plain C strings
// never did.
[[noreturn]] void fail(const std::string& message) { TORCH_CHECK(false, message.c_str()); }

std::string shape(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

void check_tensor(const at::Tensor& t, const std::string& name, at::ScalarType dtype, int64_t dim,
                  const at::Device& device) {
  if (!t.defined()) fail("mok: " + name + " is undefined");
  if (!t.is_cuda()) fail("mok: " + name + " must be a CUDA tensor");
  if (t.device() != device) {
    fail("mok: " + name + " is on cuda:" + std::to_string(t.device().index()) + " but a is on cuda:" +
         std::to_string(device.index()));
  }
  if (t.scalar_type() != dtype) {
    fail("mok: " + name + " must be " + c10::toString(dtype) + " (got " + c10::toString(t.scalar_type()) + ")");
  }
  if (t.dim() != dim) {
    fail("mok: " + name + " must have " + std::to_string(dim) + " dimensions (got shape " + shape(t) + ")");
  }
  if (!t.is_contiguous()) fail("mok: " + name + " must be contiguous");
}

at::Tensor run(const at::Tensor& a, const at::Tensor& b, const at::Tensor& group_offset,
               const at::Tensor& group_rows, mok::GemmEpilogue epilogue) {
  if (!a.defined() || !a.is_cuda()) fail("mok: a must be a CUDA tensor");
  const at::Device device = a.device();
  check_tensor(a, "a", at::kBFloat16, 2, device);
  check_tensor(b, "b", at::kBFloat16, 3, device);
  check_tensor(group_offset, "group_offset", at::kInt, 1, device);
  check_tensor(group_rows, "group_rows", at::kInt, 1, device);
  const int64_t groups = b.size(0);
  const bool swiglu = epilogue == mok::GemmEpilogue::kSwiGLU;
  if (a.size(1) != b.size(2)) {
    fail("mok: a is [M, K] = " + shape(a) + " but b is [G, N, K] = " + shape(b) + ": K differs");
  }
  if (swiglu && b.size(1) % 2 != 0) {
    fail("mok: w13 must be [G, 2N, K] (gate rows then up rows); got " + shape(b));
  }
  if (group_rows.size(0) != groups) {
    fail("mok: group_rows must have G = " + std::to_string(groups) + " entries (got " +
         std::to_string(group_rows.size(0)) + ")");
  }
  if (group_offset.size(0) != groups + 1) {
    fail("mok: group_offset must have G + 1 = " + std::to_string(groups + 1) + " entries (got " +
         std::to_string(group_offset.size(0)) + ")");
  }
  if (groups > 2147483647) fail("mok: too many groups: " + std::to_string(groups));
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
  args.m_total = a.size(0);
  args.n = n;
  args.k = a.size(1);
  args.epilogue = epilogue;
  try {
    mok::grouped_gemm(args, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  } catch (const mok::Error& e) {
    fail(e.what());
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
