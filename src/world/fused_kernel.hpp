// The fused forward kernel as the host sees it: its facts (limits and the
// sizes a workspace holds for it), the shared-memory attribute it needs, and
// its cooperative launch. The only host files that include the kernel are
// fused_kernel.cu (the bf16 instantiations) and fused_kernel_fp8.cu (the
// FP8 one, a translation unit of its own so that the two compile in
// parallel).
#pragma once

#include <cuda_runtime.h>

#include "device/kernel/fused_forward_params.hpp"
#include "mok/layer_config.hpp"
#include "world/kernel_facts.hpp"

namespace mok::world {

// The facts of the instantiation that runs a layer of `dtype`: the bf16
// forward's, or (kFP8E4M3) the FP8 forward's, whose routed m-tiles are 64
// rows. The backward runs bf16 only and takes the bf16 facts.
KernelFacts fused_kernel_facts(DType dtype = DType::kBF16);

// Once per GPU that launches the kernel, before the first launch there: the
// bf16 instantiations (inference and training), or with `fp8` the FP8 one.
void allow_fused_kernel_smem(bool system_scope, bool fp8 = false);

// A cooperative launch of `ctas` CTAs: it fails cleanly instead of starting
// when the grid cannot be resident all at once (other work on the GPU, MPS
// limits), which the protocol's progress argument needs (docs/protocol.md).
// `system_scope`: counters at system scope (peers on other GPUs), else one GPU.
// `training`: the instantiation that also keeps the gate/up pre-activations
// of the ranks that give buffers for them (RankView::preact).
// `fp8`: the FP8 forward (LayerConfig::dtype kFP8E4M3), which has no
// training instantiation (mok::Error with `training`).
void launch_fused_kernel(const device::FusedForwardParams& params, int ctas, cudaStream_t stream,
                         bool system_scope, bool training = false, bool fp8 = false);

// fused_kernel_fp8.cu: the FP8 instantiation's attribute and launch.
void allow_fused_kernel_fp8_smem(bool system_scope);
void launch_fused_kernel_fp8(const device::FusedForwardParams& params, int ctas, cudaStream_t stream,
                             bool system_scope);

}  // namespace mok::world
