#include "world/trace_readback.hpp"

#include "world/device_scope.hpp"
#include "world/trace_memory.hpp"

namespace mok::world {

std::vector<TraceEvent> read_trace(const WorldState& s) {
  DeviceScope on(s.report_device());
  return TraceMemory{s.trace_memory, s.trace_blocks, s.trace_per_block}.read("trace", s.options.trace_events);
}

}  // namespace mok::world
