// The pass trace as the host reads it back (options.trace_events > 0).
#pragma once

#include <vector>

#include "mok/pass_trace.hpp"
#include "world/world_state.hpp"

namespace mok::world {

// The last pass's events, in no particular order; the pass must have ended.
// Throws mok::Error if a CTA recorded more than its share of trace_events.
std::vector<TraceEvent> read_trace(const WorldState& state);

}  // namespace mok::world
