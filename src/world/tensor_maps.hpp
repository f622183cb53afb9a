// The TMA tensor maps of one rank: built on the host from the rank's
// workspace and the caller's tensors, then copied into the rank's workspace
// on the pass's stream (the kernel reads them from global memory).
#pragma once

#include <cuda_runtime.h>

#include "device/kernel/fused_forward_params.hpp"
#include "mok/fused_forward.hpp"
#include "mok/layer_config.hpp"

namespace mok::world {

#include <array>

using RankTensorMaps = std::array<CUtensorMap, device::kNumMaps>;

// Builds rank `rank`'s maps on the host; throws mok::Error when the driver
// refuses one (nothing is enqueued, so a pass can still be abandoned).
RankTensorMaps encode_tensor_maps(const LayerConfig& config, const FusedForwardOptions& options,
                                  const device::RankView& view, const RankTensors& tensors, int rank);
// Enqueues their copy into view.maps on `stream`. The caller orders it after
// every pass that may still read the old maps. The copy is from pageable
// memory, staged before the call returns -- except inside a CUDA graph
// capture, which records the host address instead: never upload there.
void upload_tensor_maps(const RankTensorMaps& maps, const device::RankView& view, cudaStream_t stream);

}  // namespace mok::world
