// The GEMM CTA's signaler thread (gemm_role.cuh).
#pragma once

#include <cstdint>

#include "device/roles/gemm_role.cuh"

namespace mok::device {

// The signaler (one thread of the producer warpgroup): publishes each task
// the consumers finished, in order, then frees its queue slot. Returns when
// the consumers post the end of the task list.
template <cuda::thread_scope kScope>
__device__ __forceinline__ void gemm_signaler(RoleContext<kScope>& ctx, FusedGemmShared& smem) {
  using protocol::TaskKind;
  const RankView& v = ctx.view();
  protocol::ForwardGeometry g = ctx.geometry(0);
  bool have_schedule = false;
  SlotCursor<kDoneSlots> done;
  for (;;) {
    mbarrier_wait_parity(&smem.done_full[done.slot], done.phase);
    const TraceStamp begin = trace_now();
    const GemmTask task = smem.done[done.slot];
    const bool routed = task.kind == TaskKind::kGateUp || task.kind == TaskKind::kDown;
    if (routed && !have_schedule) {
      g = ctx.geometry(ctx.padded_rows());  // the fetcher acquired it before queueing the task
      have_schedule = true;
    }
    switch (task.kind) {
      case TaskKind::kSharedGateUp: protocol::signal_shared_h_ready(ctx.sync, v.counters, task.m_tile); break;
      case TaskKind::kSharedDown: protocol::signal_shared_done(ctx.sync, v.counters); break;
      case TaskKind::kGateUp:
        protocol::signal_ring_consumed(ctx.sync, v.counters, g, task.minibatch);
        protocol::signal_h_ready(ctx.sync, v.counters, g, task.m_tile);
        break;
      case TaskKind::kDown:
        protocol::signal_h_consumed(ctx.sync, v.counters, g, task.minibatch);
        protocol::signal_down_done(ctx.sync, v.counters);
        break;
      case TaskKind::kNone: break;
    }
    mbarrier_arrive(&smem.done_empty[done.slot]);
    done.advance();
    if (task.kind == TaskKind::kNone) return;
    trace_record(ctx.params, TraceKind::kSignal, static_cast<int32_t>(task.kind), ctx.rank, begin, trace_now());
  }
}

}  // namespace mok::device
