// A world of the fused forward: what every world keeps (world_core.hpp: the
// ranks' GPUs, the launches, the memory this process owns or maps, the
// ordering of passes) and the forward's own part: the resolved config and
// options, every rank's layout and the kernel's pointer table. The world
// strategies (world.hpp) decide which ranks this process allocates and how a
// pass is launched; this state is where they put it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "device/kernel/fused_forward_params.hpp"
#include "mok/fused_forward.hpp"
#include "mok/layer_config.hpp"
#include "protocol/counters.hpp"
#include "world/forward_options.hpp"
#include "world/kernel_facts.hpp"
#include "world/workspace_layout.hpp"
#include "world/world_core.hpp"

namespace mok::world {

// The forward's part of a world (the pass-independent part is WorldCore).
struct WorldState : WorldCore {
  LayerConfig config;
  FusedForwardOptions options;  // with the defaults resolved
  KernelFacts kernel;
  std::vector<RankLayout> layouts;    // every rank's (a process world reads its peers' memory by them)
  PassStateLayout pass_state;         // of every rank's pass state, the world's own and a caller's
  device::FusedForwardParams params{};
  std::vector<RankTensors> last_tensors;  // the tensor maps were built for these
  uint32_t n_major_kinds = 0;             // forward_n_major_kinds, for the params (fill_params)

  // Allocates rank r's workspace on its GPU, zeroes its counters and barrier
  // words, and fills its view.
  void allocate_rank(int r);
  // The parts of the pointer table every pass shares.
  void fill_params();
  // Rank r's workspace pointers in the table (its base known: owned or mapped).
  void fill_view(int r);
  // Points rank r's view at the pass state a pass uses: `state` (a caller's),
  // or the world's own in r's workspace when null. Only r itself reads it
  // (peers read the schedule's length from r's counters), so a caller's state
  // need not be visible to the other ranks.
  void use_pass_state(int r, void* state);
  // Points every known rank's view at the counter set of pass `epoch`.
  void bind_counters(uint32_t pass_epoch);
  // Host-ordered passes: rank r's counters (and with rank 0, the world's
  // report words) back to zero, on `stream`.
  void zero_counters(int r, cudaStream_t stream);
};

}  // namespace mok::world
