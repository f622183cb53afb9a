// torch.ops.mok.row_combine: out[t] = bf16(base[t] + rows[row_index[t, 0]] +
// ... + rows[row_index[t, k-1]]), fp32 sums in slot order (include/mok/
// row_combine.hpp); negative indices add nothing. The staged backward's dx =
// dx_shared + sum of the token's slot rows, in one pass instead of k gathers,
// conversions and additions. Kernels: CUDA, Meta, CPU (refuses).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>

#include "mok/row_combine.hpp"
#include "op_checks.hpp"
#include "op_errors.hpp"
#include "op_outputs.hpp"

namespace {

using mok::torch_ops::check_shape;
using mok::torch_ops::check_tensor;
using mok::torch_ops::expect;
using mok::torch_ops::TensorSpec;

const TensorSpec kRowsSpec{at::kBFloat16, 2, /*aligned=*/true};
const TensorSpec kIndexSpec{at::kInt, 2};

void check_row_combine(const at::Tensor& rows, const at::Tensor& row_index, const std::optional<at::Tensor>& base) {
  expect(rows.defined(), "rows is undefined");
  const at::Device device = rows.device();
  mok::torch_ops::expect_cuda(device, "rows");
  check_tensor(rows, "rows", kRowsSpec, device, "rows is on");
  check_tensor(row_index, "row_index", kIndexSpec, device, "rows is on");
  expect(rows.size(1) % 8 == 0, "rows must have a multiple of 8 columns (got " + mok::torch_ops::shape_of(rows) + ")");
  if (base.has_value()) {
    check_tensor(*base, "base", kRowsSpec, device, "rows is on");
    check_shape(*base, "base", {row_index.size(0), rows.size(1)}, "[tokens, width]");
  }
}

at::Tensor row_combine(const at::Tensor& rows, const at::Tensor& row_index, const std::optional<at::Tensor>& base) {
  check_row_combine(rows, row_index, base);
  const c10::cuda::CUDAGuard guard(rows.device());
  at::Tensor out = mok::torch_ops::written_output({row_index.size(0), rows.size(1)}, rows.options());
  mok::RowCombineArgs args;
  args.rows = rows.data_ptr();
  args.row_index = row_index.data_ptr<int32_t>();
  args.base = base.has_value() ? base->data_ptr() : nullptr;
  args.out = out.data_ptr();
  args.num_rows = rows.size(0);
  args.tokens = row_index.size(0);
  args.k = static_cast<int>(mok::torch_ops::checked_int(row_index.size(1), "k (row_index.size(1))"));
  args.width = rows.size(1);
  mok::torch_ops::raising_torch_errors(
      [&] { mok::row_combine(args, c10::cuda::getCurrentCUDAStream(rows.device().index()).stream()); });
  return out;
}

at::Tensor row_combine_meta(const at::Tensor& rows, const at::Tensor& row_index, const std::optional<at::Tensor>& base) {
  check_row_combine(rows, row_index, base);
  return at::empty({row_index.size(0), rows.size(1)}, rows.options());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
  m.def("row_combine(Tensor rows, Tensor row_index, Tensor? base) -> Tensor");
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) { m.impl("row_combine", &row_combine); }
TORCH_LIBRARY_IMPL(mok, Meta, m) { m.impl("row_combine", &row_combine_meta); }
// CPU tensors reach the checks, which refuse them by name.
TORCH_LIBRARY_IMPL(mok, CPU, m) { m.impl("row_combine", &row_combine); }
