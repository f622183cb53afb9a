// What differs between the worlds, behind one interface: virtual_world.cu
// (R ranks on one GPU), peer_world.cu (one process, one GPU per rank),
// process_world.cu (one process per GPU, CUDA IPC). The facades
// (fused_forward.cu, fused_backward.cu) validate, lay the workspaces out and
// drive every pass the same way (pass_launch.cu); a world says which ranks
// this process allocates, how a pass is split into launches, and what must
// happen between the steps of a pass; every hook serves both pass kinds.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "world/world_core.hpp"

namespace mok::world {

// What the process world's exchange of workspaces needs of a pass kind.
struct WorkspaceExchange {
  uint64_t fingerprint = 0;         // of the pass kind's layout: every rank's must agree
  std::vector<size_t> bytes;        // [R] each rank's workspace
  std::function<void(int)> mapped;  // rank q's workspace was mapped: point its views there
  std::function<void()> closing;    // before the mappings close: keep what must outlive them
};

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

  // Whether the pass kind must stage the inputs its peers read into its own
  // workspace (the process world: a caller's tensors are not IPC-visible).
  virtual bool stages_inputs() const { return false; }

  // The process world's exchange of workspaces (other worlds refuse), for
  // either pass kind: what it needs of the pass is `exchange`.
  virtual std::vector<uint8_t> export_handle(const WorldCore& core, const WorkspaceExchange& exchange) const;
  virtual void import_peers(WorldCore& core, const WorkspaceExchange& exchange,
                            std::span<const std::vector<uint8_t>> handles);
  virtual void close_peers(WorldCore& core, const WorkspaceExchange& exchange);
};

std::unique_ptr<World> make_virtual_world();
std::unique_ptr<World> make_peer_world();
std::unique_ptr<World> make_process_world();
// The world of `kind`.
std::unique_ptr<World> make_world(WorldKind kind);

}  // namespace mok::world
