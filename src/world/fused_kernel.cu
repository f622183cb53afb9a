#include "world/fused_kernel.hpp"

#include "common/cuda_check.hpp"
#include "device/kernel/fused_forward_kernel.cuh"
#include "mok/error.hpp"
#include "world/cooperative_launch.hpp"

namespace mok::world {
namespace {

static_assert(alignof(CUtensorMap) <= 1024, "the workspace aligns its regions to 1 KB (workspace_layout.hpp)");
static_assert(protocol::kinds_block_m<protocol::ForwardPass>(protocol::Rows::kSchedule) == device::FusedGemmCfg::kBlockM,
              "the forward table's routed tiles are the kernel's GEMM tiles");

template <cuda::thread_scope kScope, bool kTraining>
void launch(const device::FusedForwardParams& params, int ctas, cudaStream_t stream) {
  launch_cooperative(device::fused_forward_kernel<kScope, kTraining>, params, ctas, device::kFusedThreads,
                     device::fused_smem_bytes(), stream);
}

}  // namespace

KernelFacts fused_kernel_facts(DType dtype) {
  KernelFacts f;
  f.tile_m = device::FusedGemmCfg::kBlockM;
  f.token_tile_m = protocol::kinds_block_m<protocol::ForwardPass>(protocol::Rows::kTokens);
  f.schedule_warps_per_cta = device::kScheduleWarpsPerCta;
  f.max_top_k = device::kMaxTopK;
  f.max_hidden = static_cast<int>(device::kCopySlotBytes / sizeof(uint16_t));
  f.max_fp8_k = device::kMaxFp8KBlocks * 128;
  f.max_local_experts = device::kMaxScheduleExperts;
  f.tensor_maps = device::kNumMaps;
  f.tensor_map_bytes = sizeof(CUtensorMap);
  f.tensor_map_alignment = alignof(CUtensorMap);
  if (dtype == DType::kFP8E4M3) {
    // The same kernel over the FP8 table: its routed kinds' tiles set the
    // schedule's padding and the ring's m-tiles; everything else is shared.
    f.tile_m = protocol::kinds_block_m<protocol::ForwardFp8Pass>(protocol::Rows::kSchedule);
    f.token_tile_m = protocol::kinds_block_m<protocol::ForwardFp8Pass>(protocol::Rows::kTokens);
  }
  return f;
}

template <class Kernel>
void allow_smem(Kernel kernel) {
  MOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, device::fused_smem_bytes()));
}

void allow_fused_kernel_smem(bool system_scope, bool fp8) {
  if (fp8) {
    allow_fused_kernel_fp8_smem(system_scope);
  } else if (system_scope) {
    allow_smem(device::fused_forward_kernel<cuda::thread_scope_system, false>);
    allow_smem(device::fused_forward_kernel<cuda::thread_scope_system, true>);
  } else {
    allow_smem(device::fused_forward_kernel<cuda::thread_scope_device, false>);
    allow_smem(device::fused_forward_kernel<cuda::thread_scope_device, true>);
  }
}

void launch_fused_kernel(const device::FusedForwardParams& params, int ctas, cudaStream_t stream,
                         bool system_scope, bool training, bool fp8) {
  if (fp8) {
    // Refused earlier with the rank named (check_rank_tensors); this is the
    // last line of defence against launching an instantiation that does not exist.
    if (training) throw Error("fused forward: the FP8 forward has no training mode (preact buffers given)");
    launch_fused_kernel_fp8(params, ctas, stream, system_scope);
  } else if (system_scope) {
    training ? launch<cuda::thread_scope_system, true>(params, ctas, stream)
             : launch<cuda::thread_scope_system, false>(params, ctas, stream);
  } else {
    training ? launch<cuda::thread_scope_device, true>(params, ctas, stream)
             : launch<cuda::thread_scope_device, false>(params, ctas, stream);
  }
}

}  // namespace mok::world
