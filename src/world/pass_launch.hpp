// One pass of the fused forward, enqueued the same way in every world; the
// world (world.hpp) supplies its launches and what happens between the steps.
#pragma once

#include <cuda_runtime.h>

#include <span>
#include <vector>

#include "mok/fused_forward.hpp"
#include "world/world.hpp"
#include "world/world_state.hpp"

namespace mok::world {

// `tensors`: the tensors of the ranks the launches serve, in rank order;
// `streams[i]`: launch i's stream. Steps, per launch:
//   1. wait for the previous pass's end there (whatever stream it ran on):
//      nothing below may touch a workspace a running pass still reads;
//   2. world.before_workspace (peer, host-ordered: the GPUs meet; process:
//      stage the inputs);
//   3. tensor maps (when a tensor moved), host-ordered: counters and trace
//      counts back to zero;
//   4. world.before_launch (peer, host-ordered: the GPUs meet again);
//   5. the launch, then its "pass done" event.
void launch_pass(WorldState& state, World& world, std::vector<RankTensors> tensors,
                 std::span<const cudaStream_t> streams);

// Blocks until the last pass ended on every launch, wherever it ran. Before
// any pass, or after a captured one (a graph replays on its stream), it
// synchronizes `streams` instead (streams[i] on launch i's GPU).
void wait_for_last_pass(const WorldState& state, std::span<const cudaStream_t> streams);

}  // namespace mok::world
