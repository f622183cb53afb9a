// Reading what a pass left for the host and turning it into a mok::Error: a
// stalled wait, a bad routing entry, or (device-ordered) a world barrier that
// gave up.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "world/world_core.hpp"
#include "world/world_state.hpp"

namespace mok::world {

// Device-ordered passes: throws mok::Error (and marks the world broken) if a
// world barrier wait of a rank this process allocated gave up.
// `barrier_offset[r]`: rank r's barrier words in its workspace; `what`: the
// pass ("fused forward"); `options`: their description, for the message.
void throw_if_barrier_broke(WorldCore& core, std::span<const size_t> barrier_offset, double timeout_seconds,
                            const std::string& what, const std::string& options);

// A pass's abort flag and stall report, read from device memory anywhere
// (another GPU's, mapped or peer).
PassReport read_report_at(const WorldCore& core, const uint32_t* abort, const protocol::StallReport* stall);

// The last pass's report. Device-ordered: from rank 0's counter set of that
// pass, stable until the end of the next pass (which this host has not
// enqueued). The pass must have ended.
PassReport read_pass_report(const WorldState& state);

// Throws mok::Error if the last pass aborted (a barrier wait that gave up
// first: it breaks the world for good and explains any other report).
void throw_if_aborted(WorldState& state);

}  // namespace mok::world
