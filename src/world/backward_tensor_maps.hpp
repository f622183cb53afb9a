// The fused backward's tensor maps: built on the host for each pass (its
// tensors may move from pass to pass), uploaded by the pass's steps
// (backward_steps.cu) into each rank's workspace, where the kernel's
// producers read them (protocol::map_index says which kind reads which).
#pragma once

#include <cuda.h>

#include <array>
#include <cstddef>
#include <span>
#include <vector>

#include "device/kernel/fused_backward_params.hpp"
#include "mok/fused_backward.hpp"
#include "world/backward_state.hpp"

namespace mok::world {

// Every rank's tensor maps, sized for the recompute table, which has the
// most kinds; `count` is this pass's (what it uploads).
inline constexpr size_t kMostBackwardMaps = device::kBackwardMaps<protocol::BackwardRecomputePass>;
static_assert(kMostBackwardMaps >= device::kNumBackwardMaps);
struct BackwardMaps {
  std::vector<std::array<CUtensorMap, kMostBackwardMaps>> sets;  // one per served rank, from the first launch's first
  size_t count = 0;
};

// The maps of the served ranks (`ranks`: from the first launch's first rank
// on) for a pass whose token counts are already in the views. Host only: a
// failure here enqueues nothing. bf16_grads: also the weight gradients'
// output maps (their tiles are stored by TMA).
BackwardMaps encode_backward_maps(BackwardState& s, std::span<const BackwardRankTensors> ranks, bool bf16_grads);

}  // namespace mok::world
