// Device side of the pass trace (include/mok/pass_trace.hpp): one event per
// call, appended to the block's region of the trace buffer when tracing is
// on. A stamp is a %globaltimer read and an SM cycle-counter read; with
// tracing off, recording is one branch.
#pragma once

#include <cuda/ptx>

#include <cstdint>

#include "device/kernel/fused_forward_params.hpp"
#include "mok/pass_trace.hpp"
#include "protocol/pass_forward.hpp"

namespace mok::device {

static_assert(static_cast<int>(TraceTask::kSharedGateUp) == static_cast<int>(protocol::ForwardPass::kSharedGateUp) &&
                  static_cast<int>(TraceTask::kSharedDown) == static_cast<int>(protocol::ForwardPass::kSharedDown) &&
                  static_cast<int>(TraceTask::kGateUp) == static_cast<int>(protocol::ForwardPass::kGateUp) &&
                  static_cast<int>(TraceTask::kDown) == static_cast<int>(protocol::ForwardPass::kDown),
              "trace task ids are the forward pass's task kinds");

// A point in time: the GPU's nanosecond timer and this SM's cycle counter.
// Both stamps of an event are taken on the same SM (cycle counters of
// different SMs are not comparable).
struct TraceStamp {
  uint64_t ns;
  uint64_t cycles;
};

__device__ __forceinline__ TraceStamp trace_now() {
  return TraceStamp{cuda::ptx::get_sreg_globaltimer(), static_cast<uint64_t>(clock64())};
}

// The block's next free event (shared memory): a block appends to its own
// region of the buffer, so recording costs a shared-memory atomic and
// fire-and-forget global writes, not a round trip to one global counter.
__device__ __forceinline__ uint32_t& trace_cursor() {
  __shared__ uint32_t cursor;
  return cursor;
}

// Thread 0 of every block, before the block's first __syncthreads.
__device__ __forceinline__ void trace_begin_block() { trace_cursor() = 0; }

template <class Params>
__device__ __forceinline__ void trace_record(const Params& params, TraceKind kind, int32_t detail,
                                             int32_t rank, TraceStamp begin, TraceStamp end) {
  if (params.trace == nullptr) return;
  // The block's region: blocks of every launch of the world, in rank order.
  const uint32_t block = static_cast<uint32_t>(params.first_rank * params.ctas_per_rank) + blockIdx.x;
  const uint32_t i = atomicAdd(&trace_cursor(), 1u);
  atomicMax(&params.trace_count[block], i + 1);  // the host reports an overflow
  if (i >= params.trace_capacity) return;
  TraceEvent e;
  e.begin_ns = begin.ns;
  e.end_ns = end.ns;
  const uint64_t cycles = end.cycles - begin.cycles;
  e.cycles = cycles > 0xffffffffull ? 0xffffffffu : static_cast<uint32_t>(cycles);
  e.detail = detail;
  e.cta = static_cast<uint16_t>(blockIdx.x);
  e.rank = static_cast<uint8_t>(rank);
  e.kind = static_cast<uint8_t>(kind);
  params.trace[static_cast<size_t>(block) * params.trace_capacity + i] = e;
}

}  // namespace mok::device
