// torch.ops.mok.scatter_rows: each token's row of every source copied to the
// rows its k entries were scheduled to, rows no entry claims zeroed (with
// zero_padding=False left uninitialised, except under torch's deterministic
// fill: op_outputs.hpp; include/mok/scatter_rows.hpp) --
// the staged backward's x and dout rows in schedule order, both in one pass
// that reads each token's rows once.
// Kernels: CUDA, Meta, CPU (refuses).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "mok/scatter_rows.hpp"
#include "op_checks.hpp"
#include "op_errors.hpp"
#include "op_outputs.hpp"

namespace {

using mok::torch_ops::check_shape;
using mok::torch_ops::check_tensor;
using mok::torch_ops::expect;
using mok::torch_ops::TensorSpec;

const TensorSpec kSourceSpec{at::kBFloat16, 2, /*aligned=*/true};
const TensorSpec kEntryIndexSpec{at::kLong, 2};
const TensorSpec kRowIndexSpec{at::kLong, 1};

void check_scatter_rows(const std::vector<at::Tensor>& sources, const at::Tensor& row_of_entry,
                        const at::Tensor& entry_of_row) {
  expect(!sources.empty() && sources.size() <= static_cast<size_t>(mok::kMaxScatterSources),
         "sources must hold 1 to 4 tensors (got " + std::to_string(sources.size()) + ")");
  expect(sources[0].defined(), "sources[0] is undefined");
  const at::Device device = sources[0].device();
  mok::torch_ops::expect_cuda(device, "sources[0]");
  for (size_t s = 0; s < sources.size(); ++s) {
    const std::string name = "sources[" + std::to_string(s) + "]";
    check_tensor(sources[s], name, kSourceSpec, device, "sources[0] is on");
    check_shape(sources[s], name, {sources[0].size(0), sources[0].size(1)}, "sources[0]'s [tokens, width]");
  }
  expect(sources[0].size(1) % 8 == 0,
         "sources must have a multiple of 8 columns (got " + mok::torch_ops::shape_of(sources[0]) + ")");
  check_tensor(row_of_entry, "row_of_entry", kEntryIndexSpec, device, "sources[0] is on");
  expect(row_of_entry.size(0) == sources[0].size(0),
         "row_of_entry must be [tokens, k] with tokens = sources[0].size(0) (got " +
             mok::torch_ops::shape_of(row_of_entry) + " for " + mok::torch_ops::shape_of(sources[0]) + ")");
  check_tensor(entry_of_row, "entry_of_row", kRowIndexSpec, device, "sources[0] is on");
  const int64_t k = row_of_entry.size(1);
  expect(k >= 1 && k <= 64, "k = " + std::to_string(k) + " must be in [1, 64] (row_of_entry is [tokens, k])");
}

std::vector<at::Tensor> empty_outputs(const std::vector<at::Tensor>& sources, const at::Tensor& entry_of_row) {
  std::vector<at::Tensor> outs;
  for (const at::Tensor& s : sources) {
    outs.push_back(mok::torch_ops::written_output({entry_of_row.size(0), s.size(1)}, s.options()));
  }
  return outs;
}

std::vector<at::Tensor> scatter_rows(const std::vector<at::Tensor>& sources, const at::Tensor& row_of_entry,
                                     const at::Tensor& entry_of_row, bool zero_padding) {
  check_scatter_rows(sources, row_of_entry, entry_of_row);
  const c10::cuda::CUDAGuard guard(sources[0].device());
  std::vector<at::Tensor> outs = empty_outputs(sources, entry_of_row);
  mok::ScatterRowsArgs args;
  for (size_t s = 0; s < sources.size(); ++s) {
    args.sources[s] = sources[s].data_ptr();
    args.outs[s] = outs[s].data_ptr();
  }
  args.num_sources = static_cast<int>(sources.size());
  args.row_of_entry = row_of_entry.data_ptr<int64_t>();
  args.entry_of_row = entry_of_row.data_ptr<int64_t>();
  args.tokens = sources[0].size(0);
  args.k = mok::torch_ops::checked_int(row_of_entry.size(1), "k (row_of_entry.size(1))");
  args.num_rows = entry_of_row.size(0);
  args.width = sources[0].size(1);
  args.zero_unclaimed_rows = mok::torch_ops::clear_unwritten_rows(zero_padding);
  mok::torch_ops::raising_torch_errors(
      [&] { mok::scatter_rows(args, c10::cuda::getCurrentCUDAStream(sources[0].device().index()).stream()); });
  return outs;
}

std::vector<at::Tensor> scatter_rows_meta(const std::vector<at::Tensor>& sources, const at::Tensor& row_of_entry,
                                          const at::Tensor& entry_of_row, bool /*zero_padding*/) {
  check_scatter_rows(sources, row_of_entry, entry_of_row);
  return empty_outputs(sources, entry_of_row);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
  m.def("scatter_rows(Tensor[] sources, Tensor row_of_entry, Tensor entry_of_row, *, bool zero_padding=True) "
        "-> Tensor[]");
}

TORCH_LIBRARY_IMPL(mok, CUDA, m) { m.impl("scatter_rows", &scatter_rows); }
TORCH_LIBRARY_IMPL(mok, Meta, m) { m.impl("scatter_rows", &scatter_rows_meta); }
// CPU tensors reach the checks, which refuse them by name.
TORCH_LIBRARY_IMPL(mok, CPU, m) { m.impl("scatter_rows", &scatter_rows); }
