// What differs between the worlds, behind one interface: virtual_world.cu
// (R ranks on one GPU), peer_world.cu (one process, one GPU per rank),
// process_world.cu (one process per GPU, CUDA IPC). The facades
// (fused_forward.cu, fused_backward.cu) validate, lay the workspaces out and
// drive every pass the same way (pass_launch.cu); a world says which ranks
// this process allocates, how a pass is split into launches, and what must
// happen between the steps of a pass. The hooks on WorldCore serve every pass
// kind; those on WorldState only the forward (the process world's staging and
// handle exchange, which the backward does not run yet).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "mok/fused_forward.hpp"
#include "world/world_state.hpp"

namespace mok::world {

class World {
 public:
  virtual ~World() = default;

  // Whether this process allocates rank r's workspace (the others it maps,
  // or never sees).
  virtual bool allocates(int rank) const = 0;
  // The launches of every pass, in order.
  virtual std::vector<Launch> launches(const WorldCore& core) const = 0;
  // Once, before any workspace is allocated (peer access between GPUs).
  virtual void connect(WorldCore&) {}

  // Steps of every pass (enqueue_pass, pass_launch.hpp). `streams[i]` is
  // launch i's stream. After every launch's stream waited for the previous
  // pass, before any workspace is touched:
  virtual void before_workspace(WorldCore&, std::span<const cudaStream_t> /*streams*/) {}
  // After every workspace is ready for the pass, before the first launch.
  virtual void before_launch(WorldCore&, std::span<const cudaStream_t> /*streams*/) {}
  // Whether every rank's workspace this process needs is mapped.
  virtual bool ready_to_run(const WorldCore&) const { return true; }

  // The forward's process world: its inputs staged where peers read them
  // (`tensors` redirected there), called after before_workspace; other
  // worlds leave the caller's tensors where they are.
  virtual void stage_inputs(WorldState&, std::span<const cudaStream_t> /*streams*/,
                            std::vector<RankTensors>& /*tensors*/) {}
  // The forward's process world's exchange of workspaces; other worlds refuse.
  virtual std::vector<uint8_t> export_handle(const WorldState& state) const;
  virtual void import_peers(WorldState& state, std::span<const std::vector<uint8_t>> handles);
  virtual void close_peers(WorldState& state);
};

std::unique_ptr<World> make_virtual_world();
std::unique_ptr<World> make_peer_world();
std::unique_ptr<World> make_process_world();
// The world of `kind`.
std::unique_ptr<World> make_world(WorldKind kind);

}  // namespace mok::world
