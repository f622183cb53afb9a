// The GEMM CTA's signaler thread (gemm_role.cuh).
#pragma once

#include <cstdint>

#include "device/roles/gemm_role.cuh"

namespace mok::device {

// The signaler (one thread of the producer warpgroup): publishes each task
// the consumers finished, in order, then frees its task slot for the
// producer. A task whose kind signals late (protocol::signals_late: its TMA
// stores may still be in flight at its hand-off) is published with the next
// task the consumers finish, or the end of the list: by then the threads
// that issued its stores have waited for them (gemm_consumer.cuh). Returns
// when the consumers finish the end of the task list.
template <class Ctx>
__device__ __forceinline__ void gemm_signaler(Ctx& ctx, FusedGemmShared& smem) {
  using Pass = typename Ctx::Pass;
  // Counter indices depend on the ring's shape only, never on the schedule's
  // length: the geometry without schedule rows serves every task.
  const protocol::PassGeometry<Pass> g = ctx.geometry(0);
  auto publish = [&](const GemmTask& task) {
    protocol::visit_kind<Pass>(task.kind, [&](auto K) {
      // (A per-expert counter names the task's expert; no target is computed here.)
      protocol::signal_outputs<protocol::KindSpec<Pass, protocol::index_of<decltype(K)>>>(
          ctx.sync, ctx.counters(), g, task.minibatch, task.m_tile, protocol::ExpertOfWork{task.expert, 0});
    });
  };
  GemmTask held_back;
  held_back.kind = protocol::kNoTask;
  SlotCursor<kTaskSlots> done;
  for (;;) {
    mbarrier_wait_parity(&smem.done_full[done.slot], done.phase);
    const TraceStamp begin = trace_now();
    // Still the consumers' task: the producer posts to this slot again only
    // after the arrival below.
    const GemmTask task = smem.tasks[done.slot];
    if (held_back.kind != protocol::kNoTask) publish(held_back);
    bool late = false;
    protocol::visit_kind<Pass>(task.kind, [&](auto K) {
      late = protocol::signals_late(Pass::kKinds[protocol::index_of<decltype(K)>].out);
    });
    held_back.kind = protocol::kNoTask;
    if (late) {
      held_back = task;
    } else {
      publish(task);
    }
    mbarrier_arrive(&smem.task_empty[done.slot]);
    done.advance();
    if (task.kind == protocol::kNoTask) return;
    trace_record(ctx.params, TraceKind::kSignal, task.kind, ctx.rank, begin, trace_now());
  }
}

}  // namespace mok::device
