// The GEMM CTA's consumer warpgroups: mainloop, epilogue, handoff (gemm_role.cuh).
#pragma once

#include <cstdint>

#include "device/roles/consumer_stall.cuh"
#include "device/roles/gemm_role.cuh"

namespace mok::device {

// Consumer warpgroup `consumer` (0 or 1). Returns at the end of the task list
// (an aborted pass ends it early); a barrier stall never returns
// (consumer_stall.cuh).
template <cuda::thread_scope kScope>
__device__ __forceinline__ void gemm_consumer(RoleContext<kScope>& ctx, FusedGemmShared& smem, int consumer) {
  using protocol::TaskKind;
  const RankView& v = ctx.view();
  const int lane = threadIdx.x % 32;
  StageRing<FusedPlainCfg::kStages> ring{smem.storage.full, smem.storage.empty};
  const protocol::ForwardGeometry shared_geometry = ctx.geometry(0);
  protocol::ForwardGeometry g = shared_geometry;
  bool have_schedule = false;
  SlotCursor<kTaskSlots> tasks;
  SlotCursor<kDoneSlots> done;
  float acc[FusedPlainCfg::kAccRegs];
  // Every barrier wait of the consumers ends a stall this way, never by a
  // trap.
  const ConsumerFaultOnStall on_stall(ctx.params.timeout_ns);

  for (;;) {
    mbarrier_wait_parity(&smem.task_full[tasks.slot], tasks.phase, on_stall);
    const GemmTask task = smem.tasks[tasks.slot];
    // The slot (and its resolved rows) stays ours until the epilogue is done.
    const int task_slot = tasks.slot;
    const uint32_t task_phase = tasks.phase;
    tasks.advance();
    if (task.kind == TaskKind::kNone) {
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&smem.task_empty[task_slot]);
      // Tell the signaler the list is over (after every earlier task).
      if (lane == 0) {
        mbarrier_wait_parity(&smem.done_empty[done.slot], done.phase ^ 1u, on_stall);
        if (consumer == 0 && threadIdx.x % 128 == 0) smem.done[done.slot] = task;
        mbarrier_arrive(&smem.done_full[done.slot]);
      }
      return;
    }
    // One thread of the CTA stamps the consumers' timeline.
    const bool tracer = ctx.params.trace != nullptr && consumer == 0 && threadIdx.x % 128 == 0;
    if (tracer) smem.trace_task_begin = trace_now();
    const bool routed = task.kind == TaskKind::kGateUp || task.kind == TaskKind::kDown;
    if (routed && !have_schedule) {
      // The fetcher acquired the schedule before queueing this task.
      g = ctx.geometry(ctx.padded_rows());
      have_schedule = true;
    }

    const int k = task.kind == TaskKind::kSharedGateUp || task.kind == TaskKind::kGateUp ? ctx.params.hidden
                  : task.kind == TaskKind::kSharedDown ? ctx.params.shared_width
                                                       : ctx.params.intermediate;
    // A warpgroup whose 64 rows are all padding (an expert's last tile, half
    // full or less) computes and stores nothing; the other one runs alone.
    const bool idle = consumer * 64 >= task.real_rows;
    if (idle) {
      skip_tile<FusedPlainCfg>(ring, k / FusedPlainCfg::kBlockK, on_stall);
    } else if (is_gate_up(task.kind)) {
      mma_tile<FusedSwigluCfg>(reinterpret_cast<GemmSharedStorage<FusedSwigluCfg>&>(smem.storage),
                               reinterpret_cast<StageRing<FusedSwigluCfg::kStages>&>(ring), consumer,
                               k / FusedPlainCfg::kBlockK, acc, on_stall);
    } else {
      mma_tile<FusedPlainCfg>(smem.storage, ring, consumer, k / FusedPlainCfg::kBlockK, acc, on_stall);
    }
    if (tracer) smem.trace_mainloop_end = trace_now();
    // Every task, not only down tasks: the resolver must be done with this
    // slot before the consumers give it back to the producer.
    mbarrier_wait_parity(&smem.rows_ready[task_slot], task_phase, on_stall);

    const int H = ctx.params.hidden, I = ctx.params.intermediate, S = ctx.params.shared_width;
    switch (idle ? TaskKind::kNone : task.kind) {
      case TaskKind::kSharedGateUp: {
        const int32_t row0 = task.row0, tokens = v.tokens;
        store_tile_rows<FusedSwigluCfg>(acc, reinterpret_cast<GemmSharedStorage<FusedSwigluCfg>&>(smem.storage),
                                        consumer, task.n_tile * kGateUpOutCols, S, [&](int i) -> uint16_t* {
                                          return row0 + i < tokens ? v.shared_h + static_cast<int64_t>(row0 + i) * S : nullptr;
                                        });
        break;
      }
      case TaskKind::kSharedDown: {
        const int32_t row0 = task.row0, tokens = v.tokens;
        store_tile_rows<FusedPlainCfg>(acc, smem.storage, consumer, task.n_tile * kDownOutCols, H,
                                       [&](int i) -> uint16_t* {
                                         return row0 + i < tokens ? v.shared_out + static_cast<int64_t>(row0 + i) * H : nullptr;
                                       });
        break;
      }
      case TaskKind::kGateUp: {
        // The fetcher waited for the h slot to be free (read by the previous
        // generation's down tasks) before queueing the task.
        const int32_t row0 = task.row0;
        store_tile_rows<FusedSwigluCfg>(acc, reinterpret_cast<GemmSharedStorage<FusedSwigluCfg>&>(smem.storage),
                                        consumer, task.n_tile * kGateUpOutCols, I, [&](int i) -> uint16_t* {
                                          return v.ring_h + static_cast<int64_t>(row0 + i) * I;
                                        });
        break;
      }
      case TaskKind::kDown: {
        // The row resolver put each row's destination in shared memory
        // during the mainloop.
        uint16_t* const* destinations = smem.row_destination[task_slot];
        store_tile_rows<FusedPlainCfg>(acc, smem.storage, consumer, task.n_tile * kDownOutCols, H,
                                       [&](int i) -> uint16_t* { return destinations[i]; });
        break;
      }
      case TaskKind::kNone: break;
    }
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&smem.task_empty[task_slot]);
    if (tracer) smem.trace_stores_end = trace_now();
    // Hand the task to the signaler. Each warp orders its generic stores
    // before later async-proxy (TMA) reads on other SMs where there are any,
    // then arrives; the
    // arrival (release, CTA scope) and the signaler's wait (acquire) put
    // these stores before the signaler's release of the counters.
    // Only h and shared_h are read by TMA; combine rows and shared_out are
    // read with plain loads, so down tasks skip the (costly) proxy fence.
    if (is_gate_up(task.kind)) fence_proxy_async_global();
    __syncwarp();
    if (lane == 0) {
      mbarrier_wait_parity(&smem.done_empty[done.slot], done.phase ^ 1u, on_stall);
      if (consumer == 0 && threadIdx.x % 128 == 0) smem.done[done.slot] = task;
      mbarrier_arrive(&smem.done_full[done.slot]);
    }
    done.advance();
    if (tracer) {
      const TraceStamp end = trace_now();
      trace_record(ctx.params, TraceKind::kMainloop, static_cast<int32_t>(task.kind), ctx.rank,
                   smem.trace_task_begin, smem.trace_mainloop_end);
      trace_record(ctx.params, TraceKind::kEpilogue, static_cast<int32_t>(task.kind), ctx.rank,
                   smem.trace_mainloop_end, smem.trace_stores_end);
      trace_record(ctx.params, TraceKind::kHandoff, static_cast<int32_t>(task.kind), ctx.rank,
                   smem.trace_stores_end, end);
    }
  }
}

}  // namespace mok::device
