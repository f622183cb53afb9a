// One pass, enqueued the same way in every world and for every pass kind:
// the world (world.hpp) supplies its launches and what happens between the
// steps, the pass kind (PassSteps) what its workspaces and kernel need.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "mok/fused_forward.hpp"
#include "world/world.hpp"
#include "world/world_core.hpp"
#include "world/world_state.hpp"

namespace mok::world {

// What one kind of pass (the forward, the backward) does at the steps of
// enqueue_pass. Launch i serves ranks core.launches[i].first_rank ..
// + ranks, on `stream` (on its GPU, which is current).
class PassSteps {
 public:
  virtual ~PassSteps() = default;
  // Once the previous pass ended on every launch and the world's GPUs met:
  // the pass's tensors and counters into the pointer table (host memory).
  virtual void bind(std::span<const cudaStream_t> streams) = 0;
  // What launch i's workspaces need before its kernel: tensor maps, zeroed
  // counters, trace counts.
  virtual void prepare(size_t launch, cudaStream_t stream) = 0;
  // Launch i's kernel.
  virtual void launch(size_t launch, cudaStream_t stream) = 0;
};

// Enqueues one pass. Per launch:
//   1. wait for the previous pass's end there (whatever stream it ran on):
//      nothing below may touch a workspace a running pass still reads
//      (captured passes are ordered by the graph's stream instead: an event
//      recorded outside a capture cannot be waited on inside it);
//   2. world.before_workspace (peer, host-ordered: the GPUs meet), then
//      steps.bind;
//   3. steps.prepare;
//   4. world.before_launch (peer, host-ordered: the GPUs meet again);
//   5. steps.launch, then its "pass done" event (not while capturing).
void enqueue_pass(WorldCore& core, World& world, PassSteps& steps, std::span<const cudaStream_t> streams,
                  bool capturing);

// Throws mok::Error (naming `who`) if no pass can be ordered now: the world
// is broken, a device-ordered pass is being captured in a graph, or the pass
// numbers ran out.
void require_orderable(const WorldCore& core, bool capturing, const std::string& who);

// After a pass failed on the host: a device-ordered pass that took a number
// (`numbered`) gives it back if no launch was enqueued, else breaks the world.
void give_back_number(WorldCore& core, bool numbered, bool launched);

// The forward's pass. `tensors`: the tensors of the ranks the launches
// serve, in rank order; `streams[i]`: launch i's stream. Host-only work
// (tensor maps, when a tensor moved) comes first, then enqueue_pass.
void launch_pass(WorldState& state, World& world, std::vector<RankTensors> tensors,
                 std::span<const cudaStream_t> streams);

// Blocks until the last pass ended on every launch, wherever it ran. Before
// any pass, or after a captured one (a graph replays on its stream), it
// synchronizes `streams` instead (streams[i] on launch i's GPU).
void wait_for_last_pass(const WorldCore& core, std::span<const cudaStream_t> streams);

// The same for a caller that cannot name a stream on each GPU (a peer
// world's single-stream check): where no pass event was recorded, every GPU
// of the world is synchronized as a whole, so that a captured pass replayed
// on a non-blocking stream is waited for too.
void wait_for_last_pass_on_every_gpu(const WorldCore& core);

}  // namespace mok::world
