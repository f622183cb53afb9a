#include "world/backward_kernel.hpp"

#include "common/cuda_check.hpp"
#include "device/kernel/fused_backward_kernel.cuh"
#include "world/cooperative_launch.hpp"

namespace mok::world {
namespace {

template <cuda::thread_scope kScope, class Params>
void allow() {
  MOK_CUDA_CHECK(cudaFuncSetAttribute(device::fused_backward_kernel<kScope, Params>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, device::fused_smem_bytes()));
}

template <class Params>
void launch(const Params& params, int ctas, cudaStream_t stream, bool system_scope) {
  if (system_scope) {
    launch_cooperative(device::fused_backward_kernel<cuda::thread_scope_system, Params>, params, ctas,
                       device::kFusedThreads, device::fused_smem_bytes(), stream);
  } else {
    launch_cooperative(device::fused_backward_kernel<cuda::thread_scope_device, Params>, params, ctas,
                       device::kFusedThreads, device::fused_smem_bytes(), stream);
  }
}

}  // namespace

void allow_backward_kernel_smem(bool system_scope) {
  if (system_scope) {
    allow<cuda::thread_scope_system, device::FusedBackwardParams>();
    allow<cuda::thread_scope_system, device::FusedBackwardRecomputeParams>();
  } else {
    allow<cuda::thread_scope_device, device::FusedBackwardParams>();
    allow<cuda::thread_scope_device, device::FusedBackwardRecomputeParams>();
  }
}

int backward_kernel_smem_bytes() { return device::fused_smem_bytes(); }

void launch_backward_kernel(const device::FusedBackwardParams& params, int ctas, cudaStream_t stream,
                            bool system_scope) {
  launch(params, ctas, stream, system_scope);
}

void launch_backward_kernel(const device::FusedBackwardRecomputeParams& params, int ctas, cudaStream_t stream,
                            bool system_scope) {
  launch(params, ctas, stream, system_scope);
}

}  // namespace mok::world
