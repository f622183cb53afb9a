// The torch ops' promise that rows no group owns come back as zeros, kept by
// clearing those rows only (mok::zero_padding_rows) after allocating the
// output uninitialised: a full at::zeros of every output cost the staged
// backward ~0.4 ms per layer on the DeepSeek-V3 slice (docs/perf-notes.md b4).
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include "mok/zero_padding.hpp"
#include "op_errors.hpp"

namespace mok::torch_ops {

// t: [M, ...] contiguous on the GPU, rows of a multiple of 16 bytes.
inline void zero_padding_rows(const at::Tensor& t, const at::Tensor& group_offset, const at::Tensor& group_rows) {
  if (t.size(0) == 0) return;
  mok::ZeroPaddingArgs args;
  args.data = t.data_ptr();
  args.row_bytes = t.numel() / t.size(0) * t.element_size();
  args.m_total = t.size(0);
  args.group_offset = group_offset.data_ptr<int32_t>();
  args.group_rows = group_rows.data_ptr<int32_t>();
  args.num_groups = static_cast<int>(group_rows.size(0));
  raising_torch_errors(
      [&] { mok::zero_padding_rows(args, c10::cuda::getCurrentCUDAStream(t.device().index()).stream()); });
}

}  // namespace mok::torch_ops
