#include "world/world.hpp"

#include "mok/error.hpp"

namespace mok::world {

std::vector<uint8_t> World::export_handle(const WorldState&) const {
  throw Error("export_handle: only a process world (options.process_rank >= 0) exports its workspace");
}

void World::import_peers(WorldState&, std::span<const std::vector<uint8_t>>) {
  throw Error("import_peers: only a process world (options.process_rank >= 0) imports its peers");
}

void World::close_peers(WorldState&) { throw Error("close_peers: only a process world maps peers"); }

}  // namespace mok::world
