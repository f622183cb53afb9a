// The fused forward kernel's FP8 instantiation (LayerConfig::dtype
// kFP8E4M3; docs/fp8-forward-design.md): the same kernel over the FP8
// table, in a translation unit of its own so that it compiles in parallel
// with the bf16 instantiations (fused_kernel.cu). Inference only: the FP8
// forward has no training mode.
#include "common/cuda_check.hpp"
#include "device/kernel/fused_forward_kernel.cuh"
#include "protocol/pass_forward_fp8.hpp"
#include "world/cooperative_launch.hpp"
#include "world/fused_kernel.hpp"

namespace mok::world {
namespace {

using Fp8Pass = protocol::ForwardFp8Pass;

// The host lays out and zeroes one counter set per pass by the forward's
// table (workspace_layout.cpp, world_state.cu); the FP8 table must count
// the same words (the kernel's device-ordered passes clear the idle set by
// its own count).
// (Compared through parameters: today the FP8 table reuses the forward's
// array, which compared in place is a self-comparison the host compiler
// warns about.)
template <class CountersA, class CountersB>
constexpr bool same_spans(const CountersA& a, const CountersB& b, int count) {
  for (int i = 0; i < count; ++i) {
    if (a[i].span != b[i].span) return false;
  }
  return true;
}
constexpr bool same_counters() {
  using Bf16 = protocol::ForwardPass;
  return Fp8Pass::kNumCounters == Bf16::kNumCounters &&
         same_spans(Fp8Pass::kCounters, Bf16::kCounters, Bf16::kNumCounters);
}
static_assert(same_counters(), "the FP8 forward's counters are laid out as the forward's");

template <cuda::thread_scope kScope>
void launch(const device::FusedForwardParams& params, int ctas, cudaStream_t stream) {
  launch_cooperative(device::fused_forward_kernel<kScope, false, Fp8Pass>, params, ctas, device::kFusedThreads,
                     device::fused_smem_bytes(), stream);
}

}  // namespace

void allow_fused_kernel_fp8_smem(bool system_scope) {
  auto kernel = system_scope ? device::fused_forward_kernel<cuda::thread_scope_system, false, Fp8Pass>
                             : device::fused_forward_kernel<cuda::thread_scope_device, false, Fp8Pass>;
  MOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, device::fused_smem_bytes()));
}

void launch_fused_kernel_fp8(const device::FusedForwardParams& params, int ctas, cudaStream_t stream,
                             bool system_scope) {
  system_scope ? launch<cuda::thread_scope_system>(params, ctas, stream)
               : launch<cuda::thread_scope_device>(params, ctas, stream);
}

}  // namespace mok::world
