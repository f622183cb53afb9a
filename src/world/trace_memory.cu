#include "world/trace_memory.hpp"

#include <algorithm>
#include <string>

#include "common/cuda_check.hpp"
#include "mok/error.hpp"
#include "world/workspace_layout.hpp"

namespace mok::world {

size_t trace_count_bytes(size_t blocks) { return align_up(blocks * sizeof(uint32_t), 256); }

void TraceMemory::clear(cudaStream_t stream) const {
  MOK_CUDA_CHECK(cudaMemsetAsync(memory, 0, trace_count_bytes(blocks), stream));
}

std::vector<TraceEvent> TraceMemory::read(const char* who, int trace_events) const {
  std::vector<uint32_t> count(blocks);
  MOK_CUDA_CHECK(cudaMemcpy(count.data(), counts(), count.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  std::vector<TraceEvent> all(blocks * per_block);
  MOK_CUDA_CHECK(cudaMemcpy(all.data(), events(), all.size() * sizeof(TraceEvent), cudaMemcpyDeviceToHost));
  std::vector<TraceEvent> kept;
  for (size_t b = 0; b < blocks; ++b) {
    if (count[b] > per_block) {
      throw Error(std::string(who) + ": block " + std::to_string(b) + " recorded " + std::to_string(count[b]) +
                  " events, more than its share of trace_events (" + std::to_string(per_block) + " = " +
                  std::to_string(trace_events) + " / " + std::to_string(blocks) + " blocks); raise trace_events");
    }
    kept.insert(kept.end(), all.begin() + static_cast<std::ptrdiff_t>(b * per_block),
                all.begin() + static_cast<std::ptrdiff_t>(b * per_block + count[b]));
  }
  return kept;
}

TraceMemory allocate_trace(size_t blocks, int trace_events) {
  TraceMemory t;
  t.blocks = blocks;
  t.per_block = std::max<size_t>(1, static_cast<size_t>(trace_events) / blocks);
  MOK_CUDA_CHECK(cudaMalloc(&t.memory, trace_count_bytes(blocks) + blocks * t.per_block * sizeof(TraceEvent)));
  return t;
}

}  // namespace mok::world
