// A cooperative launch of a fused kernel: it fails cleanly instead of
// starting when the grid cannot be resident all at once (other work on the
// GPU, MPS limits), which every fused pass's progress argument needs
// (docs/protocol.md). Shared by the forward's and the backward's launchers.
#pragma once

#include <cuda_runtime.h>

#include "common/cuda_check.hpp"

namespace mok::world {

template <class Params>
void launch_cooperative(void (*kernel)(Params), const Params& params, int ctas, int threads, int smem_bytes,
                        cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(ctas));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  config.stream = stream;
  cudaLaunchAttribute cooperative{};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  config.attrs = &cooperative;
  config.numAttrs = 1;
  MOK_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, params));
}

}  // namespace mok::world
