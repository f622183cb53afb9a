// The fused backward kernel as the host sees it: its shared-memory attribute
// and its cooperative launch. The only host file that includes the kernel.
#pragma once

#include <cuda_runtime.h>

#include "device/kernel/fused_backward_params.hpp"

namespace mok::world {

// Once per GPU, before the first launch there.
void allow_backward_kernel_smem();

// Bytes of dynamic shared memory one CTA takes.
int backward_kernel_smem_bytes();

// A cooperative launch of `ctas` CTAs (fails cleanly rather than start when
// the grid cannot be resident at once, which the protocol needs), counters
// at device scope (the virtual world).
void launch_backward_kernel(const device::FusedBackwardParams& params, int ctas, cudaStream_t stream);
// The same in recompute mode.
void launch_backward_kernel(const device::FusedBackwardRecomputeParams& params, int ctas, cudaStream_t stream);

}  // namespace mok::world
