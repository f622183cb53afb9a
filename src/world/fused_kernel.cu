#include "world/fused_kernel.hpp"

#include "common/cuda_check.hpp"
#include "device/kernel/fused_forward_kernel.cuh"
#include "world/cooperative_launch.hpp"

namespace mok::world {
namespace {

static_assert(alignof(CUtensorMap) <= 1024, "the workspace aligns its regions to 1 KB (workspace_layout.hpp)");

template <cuda::thread_scope kScope, bool kTraining>
void launch(const device::FusedForwardParams& params, int ctas, cudaStream_t stream) {
  launch_cooperative(device::fused_forward_kernel<kScope, kTraining>, params, ctas, device::kFusedThreads,
                     device::fused_smem_bytes(), stream);
}

}  // namespace

KernelFacts fused_kernel_facts() {
  KernelFacts f;
  f.tile_m = device::FusedGemmCfg::kBlockM;
  f.schedule_warps_per_cta = device::kScheduleWarpsPerCta;
  f.max_top_k = device::kMaxTopK;
  f.max_hidden = static_cast<int>(device::kCopySlotBytes / sizeof(uint16_t));
  f.max_local_experts = device::kMaxScheduleExperts;
  f.tensor_maps = device::kNumMaps;
  f.tensor_map_bytes = sizeof(CUtensorMap);
  f.tensor_map_alignment = alignof(CUtensorMap);
  return f;
}

template <class Kernel>
void allow_smem(Kernel kernel) {
  MOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, device::fused_smem_bytes()));
}

void allow_fused_kernel_smem(bool system_scope) {
  if (system_scope) {
    allow_smem(device::fused_forward_kernel<cuda::thread_scope_system, false>);
    allow_smem(device::fused_forward_kernel<cuda::thread_scope_system, true>);
  } else {
    allow_smem(device::fused_forward_kernel<cuda::thread_scope_device, false>);
    allow_smem(device::fused_forward_kernel<cuda::thread_scope_device, true>);
  }
}

void launch_fused_kernel(const device::FusedForwardParams& params, int ctas, cudaStream_t stream,
                         bool system_scope, bool training) {
  if (system_scope) {
    training ? launch<cuda::thread_scope_system, true>(params, ctas, stream)
             : launch<cuda::thread_scope_system, false>(params, ctas, stream);
  } else {
    training ? launch<cuda::thread_scope_device, true>(params, ctas, stream)
             : launch<cuda::thread_scope_device, false>(params, ctas, stream);
  }
}

}  // namespace mok::world
