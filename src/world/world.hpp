// What differs between the worlds of the fused forward, behind one interface:
// virtual_world.cu (R ranks on one GPU), peer_world.cu (one process, one GPU
// per rank), process_world.cu (one process per GPU, CUDA IPC). The facade
// (fused_forward.cu) validates, lays the workspaces out and drives every pass
// the same way (pass_launch.cu); a world says which ranks this process
// allocates, how a pass is split into launches, and what must happen between
// the steps of a pass.
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
  virtual std::vector<Launch> launches(const WorldState& state) const = 0;
  // Once, before any workspace is allocated (peer access between GPUs).
  virtual void connect(WorldState&) {}

  // Steps of a pass (pass_launch.cu). `streams[i]` is launch i's stream.
  // After every launch's stream waited for the previous pass, before any
  // workspace is touched; `tensors` may be redirected (staged inputs).
  virtual void before_workspace(WorldState&, std::span<const cudaStream_t> /*streams*/,
                                std::vector<RankTensors>& /*tensors*/) {}
  // After every workspace is ready for the pass, before the first launch.
  virtual void before_launch(WorldState&, std::span<const cudaStream_t> /*streams*/) {}

  // The process world's exchange of workspaces; other worlds refuse.
  virtual std::vector<uint8_t> export_handle(const WorldState& state) const;
  virtual void import_peers(WorldState& state, std::span<const std::vector<uint8_t>> handles);
  virtual void close_peers(WorldState& state);
  // Whether every rank's workspace this process needs is mapped.
  virtual bool ready_to_run(const WorldState&) const { return true; }
};

std::unique_ptr<World> make_virtual_world();
std::unique_ptr<World> make_peer_world();
std::unique_ptr<World> make_process_world();

}  // namespace mok::world
