// The TMA tensor maps of one rank: built on the host from the rank's
// workspace and the caller's tensors, then copied into the rank's workspace
// on the pass's stream (the kernel reads them from global memory).
#pragma once

#include <cuda_runtime.h>

#include "device/kernel/fused_forward_params.hpp"
#include "mok/fused_forward.hpp"
#include "mok/layer_config.hpp"

namespace mok::world {

// Enqueues the copy of rank `rank`'s maps into view.maps on `stream`. The
// caller orders it after every pass that may still read the old maps.
void upload_tensor_maps(const LayerConfig& config, const FusedForwardOptions& options, const device::RankView& view,
                        const RankTensors& tensors, int rank, cudaStream_t stream);

}  // namespace mok::world
