// The pass trace's device memory (options.trace_events > 0), shared by the
// fused forward and backward: per world block its event count (the counts
// padded to 256 bytes in all), then its events, per_block of them each.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mok/pass_trace.hpp"

namespace mok::world {

// Bytes of the counts of `blocks` blocks (where the events start).
size_t trace_count_bytes(size_t blocks);

// A view of one trace's memory (owned by its world or pass object).
struct TraceMemory {
  uint8_t* memory = nullptr;
  size_t blocks = 0;
  size_t per_block = 0;

  uint32_t* counts() const { return reinterpret_cast<uint32_t*>(memory); }
  TraceEvent* events() const { return reinterpret_cast<TraceEvent*>(memory + trace_count_bytes(blocks)); }
  // Every block's count back to zero, before a pass.
  void clear(cudaStream_t stream) const;
  // The last pass's events, in no particular order (it must have ended).
  // Throws mok::Error naming `who` if a block recorded more than its share
  // of `trace_events`.
  std::vector<TraceEvent> read(const char* who, int trace_events) const;
};

// Memory on the current GPU for `blocks` blocks sharing `trace_events`
// events equally (at least one each); free it with cudaFree(memory).
TraceMemory allocate_trace(size_t blocks, int trace_events);

}  // namespace mok::world
