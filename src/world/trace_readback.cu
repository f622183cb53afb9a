#include "world/trace_readback.hpp"

#include <string>

#include "common/cuda_check.hpp"
#include "mok/error.hpp"
#include "world/device_scope.hpp"

namespace mok::world {

std::vector<TraceEvent> read_trace(const WorldState& s) {
  DeviceScope on(s.report_device());
  std::vector<uint32_t> counts(s.trace_blocks);
  MOK_CUDA_CHECK(cudaMemcpy(counts.data(), s.trace_memory, counts.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  std::vector<TraceEvent> all(s.trace_blocks * s.trace_per_block);
  MOK_CUDA_CHECK(cudaMemcpy(all.data(), s.trace_memory + s.trace_count_bytes(), all.size() * sizeof(TraceEvent),
                            cudaMemcpyDeviceToHost));
  std::vector<TraceEvent> events;
  for (size_t b = 0; b < s.trace_blocks; ++b) {
    if (counts[b] > s.trace_per_block) {
      throw Error("trace: block " + std::to_string(b) + " recorded " + std::to_string(counts[b]) +
                  " events, more than its share of trace_events (" + std::to_string(s.trace_per_block) + " = " +
                  std::to_string(s.options.trace_events) + " / " + std::to_string(s.trace_blocks) +
                  " blocks); raise trace_events");
    }
    events.insert(events.end(), all.begin() + static_cast<std::ptrdiff_t>(b * s.trace_per_block),
                  all.begin() + static_cast<std::ptrdiff_t>(b * s.trace_per_block + counts[b]));
  }
  return events;
}

}  // namespace mok::world
