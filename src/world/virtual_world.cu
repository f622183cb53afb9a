// The virtual world: R ranks as R partitions of the SMs of one GPU, each with
// its own workspace, reading its peers only through the pointer table. One
// launch serves every rank; counters at device scope.
#include "world/world.hpp"

namespace mok::world {
namespace {

class VirtualWorld final : public World {
 public:
  bool allocates(int) const override { return true; }
  std::vector<Launch> launches(const WorldCore& s) const override {
    return {Launch{s.rank_device[0], 0, s.world_size}};
  }
};

}  // namespace

std::unique_ptr<World> make_virtual_world() { return std::make_unique<VirtualWorld>(); }

}  // namespace mok::world
