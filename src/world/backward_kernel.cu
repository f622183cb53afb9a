#include "world/backward_kernel.hpp"

#include "common/cuda_check.hpp"
#include "device/kernel/fused_backward_kernel.cuh"

namespace mok::world {

void allow_backward_kernel_smem() {
  MOK_CUDA_CHECK(cudaFuncSetAttribute(device::fused_backward_kernel<cuda::thread_scope_device>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, device::fused_smem_bytes()));
}

int backward_kernel_smem_bytes() { return device::fused_smem_bytes(); }

void launch_backward_kernel(const device::FusedBackwardParams& params, int ctas, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(ctas));
  config.blockDim = dim3(device::kFusedThreads);
  config.dynamicSmemBytes = static_cast<size_t>(device::fused_smem_bytes());
  config.stream = stream;
  cudaLaunchAttribute cooperative{};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  config.attrs = &cooperative;
  config.numAttrs = 1;
  MOK_CUDA_CHECK(cudaLaunchKernelEx(&config, device::fused_backward_kernel<cuda::thread_scope_device>, params));
}

}  // namespace mok::world
