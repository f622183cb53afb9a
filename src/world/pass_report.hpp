// Reading what a pass left for the host and turning it into a mok::Error: a
// stalled wait, a bad routing entry, or (device-ordered) a world barrier that
// gave up.
#pragma once

#include "world/world_state.hpp"

namespace mok::world {

// The last pass's report. Device-ordered: from rank 0's counter set of that
// pass, stable until the end of the next pass (which this host has not
// enqueued). The pass must have ended.
PassReport read_pass_report(const WorldState& state);

// Throws mok::Error if the last pass aborted (a barrier wait that gave up
// first: it breaks the world for good and explains any other report).
void throw_if_aborted(WorldState& state);

}  // namespace mok::world
