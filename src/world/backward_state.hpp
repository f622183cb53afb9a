// What a FusedBackward object keeps between passes (its pimpl derives from
// it: fused_backward.cu), for the files that build a pass from it: its rank
// views and counters in the kernel's parameters (backward_views.hpp), its
// tensor maps (backward_tensor_maps.hpp) and its steps (backward_steps.hpp).
#pragma once

#include <memory>

#include "device/kernel/fused_backward_params.hpp"
#include "mok/fused_backward.hpp"
#include "world/backward_layout.hpp"
#include "world/kernel_facts.hpp"
#include "world/workspace_layout.hpp"
#include "world/world.hpp"
#include "world/world_core.hpp"

namespace mok::world {

// Declared in this order on purpose: the world goes before the core whose
// memory it may map.
struct BackwardState {
  world::WorldCore core;  // the ranks' GPUs and workspaces, the report words, the trace, the pass events
  std::unique_ptr<world::World> world;
  LayerConfig config;
  FusedForwardOptions options;
  world::KernelFacts kernel;
  world::PassStateLayout pass_state;
  world::BackwardLayout layout;  // every rank's regions (backward_layout.hpp)
  BackwardMode mode = BackwardMode::kSave;
  // The kernel's parameters in the object's mode (the other stays unused).
  device::FusedBackwardParams params{};
  device::FusedBackwardRecomputeParams recompute_params{};
  // Calls f with the parameters of the object's mode.
  template <class F>
  void with_params(F&& f) {
    if (mode == BackwardMode::kRecompute) {
      f(recompute_params);
    } else {
      f(params);
    }
  }
};

}  // namespace mok::world
