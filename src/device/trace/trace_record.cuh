// Device side of the pass trace (include/mok/pass_trace.hpp): one event per
// call, appended to the launch's trace buffer when tracing is on. A stamp is
// one %globaltimer read; with tracing off, recording is one branch.
#pragma once

#include <cuda/ptx>

#include <cstdint>

#include "device/kernel/fused_forward_params.hpp"
#include "mok/pass_trace.hpp"
#include "protocol/forward_plan.hpp"

namespace mok::device {

static_assert(static_cast<int>(TraceTask::kSharedGateUp) == static_cast<int>(protocol::TaskKind::kSharedGateUp) &&
                  static_cast<int>(TraceTask::kSharedDown) == static_cast<int>(protocol::TaskKind::kSharedDown) &&
                  static_cast<int>(TraceTask::kGateUp) == static_cast<int>(protocol::TaskKind::kGateUp) &&
                  static_cast<int>(TraceTask::kDown) == static_cast<int>(protocol::TaskKind::kDown),
              "trace task ids are the protocol's task kinds");

__device__ __forceinline__ uint64_t trace_now() { return cuda::ptx::get_sreg_globaltimer(); }

__device__ __forceinline__ void trace_record(const FusedForwardParams& params, TraceKind kind, int32_t detail,
                                             int32_t rank, uint64_t begin_ns, uint64_t end_ns) {
  if (params.trace == nullptr) return;
  // System scope: in a peer world every GPU appends to one buffer.
  const uint32_t i = atomicAdd_system(params.trace_count, 1u);
  if (i >= params.trace_capacity) return;  // the host reports the overflow
  TraceEvent e;
  e.begin_ns = begin_ns;
  e.end_ns = end_ns;
  e.detail = detail;
  e.cta = static_cast<uint16_t>(blockIdx.x);
  e.rank = static_cast<uint8_t>(rank);
  e.kind = static_cast<uint8_t>(kind);
  params.trace[i] = e;
}

}  // namespace mok::device
