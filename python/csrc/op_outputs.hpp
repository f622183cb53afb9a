// Where the torch ops' outputs come from: allocated without torch's
// deterministic fill.
//
// Under torch.use_deterministic_algorithms(True), every at::empty on the GPU
// also launches a kernel that fills the new tensor with NaN (integers with
// their maximum), so that reading memory nothing wrote gives the same result
// every run (torch.utils.deterministic.fill_uninitialized_memory, on by
// default). mok's kernels write every element of the outputs allocated here,
// so under that mode the fill would only be bandwidth: on the DeepSeek-V3
// slice ~4.6 GB a layer's staged backward allocates, ~1.4 ms of fills (the
// training example's profile showed them; docs/perf-notes.md v21).
//
// The one exception is rows no group owns (padding) in the grouped ops'
// outputs, which the kernels never write. Where a caller asked not to have
// them cleared (zero_padding=False) or an op leaves them by design (the
// forward GEMMs, the saved pre-activations), they are cleared anyway while
// torch's fill is on (clear_unwritten_rows): every byte an op returns then
// still holds a known value in that mode -- zeros, at the padding's cost
// (~11% of those buffers on the DeepSeek-V3 slice), not the whole buffer's.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/EmptyTensor.h>

namespace mok::torch_ops {

// Whether torch fills the memory of every new tensor (see above).
inline bool torch_fills_new_tensors() {
  const at::Context& context = at::globalContext();
  return context.deterministicAlgorithms() && context.deterministicFillUninitializedMemory();
}

// An op's output whose every element the op writes: on the GPU, allocated
// below torch's factory (which is where the fill happens); elsewhere (the CPU
// path refuses its tensors before this point) as at::empty.
inline at::Tensor written_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (options.device().is_cuda()) return at::Tensor(at::detail::empty_cuda(sizes, options));
  return at::empty(sizes, options);
}

inline at::Tensor written_output_like(const at::Tensor& t) { return written_output(t.sizes(), t.options()); }

// Zeros without the fill's NaN pass before them.
inline at::Tensor zeros_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return written_output(sizes, options).zero_();
}

// Whether an op clears the rows its kernels leave unwritten: asked to, or
// torch promises a known value in memory nothing wrote.
inline bool clear_unwritten_rows(bool asked) { return asked || torch_fills_new_tensors(); }

}  // namespace mok::torch_ops
