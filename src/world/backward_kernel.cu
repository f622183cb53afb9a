#include "world/backward_kernel.hpp"

#include "common/cuda_check.hpp"
#include "device/kernel/fused_backward_kernel.cuh"
#include "world/cooperative_launch.hpp"

namespace mok::world {

void allow_backward_kernel_smem() {
  MOK_CUDA_CHECK(cudaFuncSetAttribute(device::fused_backward_kernel<cuda::thread_scope_device, device::FusedBackwardParams>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, device::fused_smem_bytes()));
  MOK_CUDA_CHECK(
      cudaFuncSetAttribute(device::fused_backward_kernel<cuda::thread_scope_device, device::FusedBackwardRecomputeParams>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, device::fused_smem_bytes()));
}

int backward_kernel_smem_bytes() { return device::fused_smem_bytes(); }

void launch_backward_kernel(const device::FusedBackwardParams& params, int ctas, cudaStream_t stream) {
  launch_cooperative(device::fused_backward_kernel<cuda::thread_scope_device, device::FusedBackwardParams>, params,
                     ctas, device::kFusedThreads, device::fused_smem_bytes(), stream);
}

void launch_backward_kernel(const device::FusedBackwardRecomputeParams& params, int ctas, cudaStream_t stream) {
  launch_cooperative(device::fused_backward_kernel<cuda::thread_scope_device, device::FusedBackwardRecomputeParams>,
                     params, ctas, device::kFusedThreads, device::fused_smem_bytes(), stream);
}

}  // namespace mok::world
