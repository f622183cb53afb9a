// A fused backward pass's steps, for enqueue_pass (pass_launch.hpp): bind
// the served ranks' tensors and this pass's counters into the kernel's
// parameters (a process world first stages what its peers read), upload the
// maps and clear the host-ordered counters and report words, launch the
// kernel on each launch's GPU.
#pragma once

#include <cuda_runtime.h>

#include <span>

#include "mok/fused_backward.hpp"
#include "world/backward_state.hpp"
#include "world/backward_tensor_maps.hpp"

namespace mok::world {

// The pass, after the previous one (which used the same workspaces); its
// tensors and options checked, its maps built (encode_backward_maps). A
// device-ordered pass takes the next number; one that fails before any
// launch gives it back, one that fails after leaves the world unorderable.
void enqueue_backward_pass(BackwardState& s, std::span<const BackwardRankTensors> ranks, const BackwardMaps& maps,
                           bool accumulate, bool bf16_grads, std::span<const cudaStream_t> streams);

}  // namespace mok::world
