// The fused backward kernel as the host sees it: its shared-memory attribute
// and its cooperative launch. The only host file that includes the kernel.
#pragma once

#include <cuda_runtime.h>

#include "device/kernel/fused_backward_params.hpp"

namespace mok::world {

// Once per GPU, before the first launch there. `system_scope`: the
// instantiations whose counters are at system scope (peers on other GPUs:
// the peer world), else one GPU (the virtual world).
void allow_backward_kernel_smem(bool system_scope);

// Bytes of dynamic shared memory one CTA takes.
int backward_kernel_smem_bytes();

// A cooperative launch of `ctas` CTAs (fails cleanly rather than start when
// the grid cannot be resident at once, which the protocol needs), counters
// at system scope or device scope.
void launch_backward_kernel(const device::FusedBackwardParams& params, int ctas, cudaStream_t stream,
                            bool system_scope);
// The same in recompute mode.
void launch_backward_kernel(const device::FusedBackwardRecomputeParams& params, int ctas, cudaStream_t stream,
                            bool system_scope);

}  // namespace mok::world
