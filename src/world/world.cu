#include "world/world.hpp"

#include <string>

#include "mok/error.hpp"

namespace mok::world {

std::vector<uint8_t> World::export_handle(const WorldCore&, const WorkspaceExchange&) const {
  throw Error("export_handle: only a process world (options.process_rank >= 0) exports its workspace");
}

void World::import_peers(WorldCore&, const WorkspaceExchange&, std::span<const std::vector<uint8_t>>) {
  throw Error("import_peers: only a process world (options.process_rank >= 0) imports its peers");
}

void World::close_peers(WorldCore&, const WorkspaceExchange&) {
  throw Error("close_peers: only a process world maps peers");
}

std::unique_ptr<World> make_world(WorldKind kind) {
  switch (kind) {
    case WorldKind::kVirtual: return make_virtual_world();
    case WorldKind::kPeer: return make_peer_world();
    case WorldKind::kProcess: return make_process_world();
  }
  throw Error("unknown world kind " + std::to_string(static_cast<int>(kind)));
}

}  // namespace mok::world
