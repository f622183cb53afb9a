// The fused forward kernel as the host sees it: its facts (limits and the
// sizes a workspace holds for it), the shared-memory attribute it needs, and
// its cooperative launch. The only host file that includes the kernel.
#pragma once

#include <cuda_runtime.h>

#include "device/kernel/fused_forward_params.hpp"
#include "world/kernel_facts.hpp"

namespace mok::world {

KernelFacts fused_kernel_facts();

// Once per GPU that launches the kernel, before the first launch there.
void allow_fused_kernel_smem(bool system_scope);

// A cooperative launch of `ctas` CTAs: it fails cleanly instead of starting
// when the grid cannot be resident all at once (other work on the GPU, MPS
// limits), which the protocol's progress argument needs (docs/protocol.md).
// `system_scope`: counters at system scope (peers on other GPUs), else one GPU.
// `training`: the instantiation that also keeps the gate/up pre-activations
// of the ranks that give buffers for them (RankView::preact).
void launch_fused_kernel(const device::FusedForwardParams& params, int ctas, cudaStream_t stream,
                         bool system_scope, bool training = false);

}  // namespace mok::world
