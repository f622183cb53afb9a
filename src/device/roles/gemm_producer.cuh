// The GEMM CTA's producer thread: tickets, input waits, posting, TMA (gemm_role.cuh).
#pragma once

#include <cstdint>

#include "device/roles/gemm_role.cuh"

namespace mok::device {

// The local expert whose padded block holds schedule row `row`, by binary
// search over the producer's shared-memory copy of the expert offsets (a
// search over global memory would be a chain of dependent L2 round trips on
// the path between two tasks).
__device__ __forceinline__ int32_t expert_of_row(const int32_t* expert_offset, int32_t num_local, int32_t row) {
  int32_t lo = 0, hi = num_local - 1;  // answer in [lo, hi]
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (expert_offset[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Producer thread: returns when the task list is exhausted or the pass aborts.
template <cuda::thread_scope kScope>
__device__ __forceinline__ void gemm_producer(RoleContext<kScope>& ctx, FusedGemmShared& smem) {
  using protocol::TaskKind;
  const RankView& v = ctx.view();
  const CUtensorMap* maps = v.maps;
  StageRing<FusedPlainCfg::kStages> ring{smem.storage.full, smem.storage.empty};
  const protocol::ForwardGeometry shared_geometry = ctx.geometry(0);
  const int64_t shared_tasks = protocol::task_count(shared_geometry);  // with 0 routed rows
  protocol::ForwardGeometry g = shared_geometry;
  bool have_schedule = false;
  int slot = 0;
  uint32_t phase = 0;

  // The next ticket is taken while the current task's operands stream, so
  // its atomic is off the path between two tasks. (Still deadlock-free: a CTA
  // works its tickets in increasing order, so the smallest unfinished ticket
  // is always the one its holder works on.)
  int64_t next_ticket = protocol::take_ticket(ctx.sync, v.counters);
  bool aborted = false;
  for (;;) {
    GemmTask task{TaskKind::kNone, -1, -1, -1, -1, 0, 0, 0};
    const TraceStamp wait_begin = trace_now();
    if (!aborted) {
      const int64_t ticket = next_ticket;
      bool ok = true;
      if (ticket >= shared_tasks && !have_schedule) {
        ok = protocol::wait_schedule_filled(ctx.sync, v.counters, ctx.schedule_warps(), ctx.rank);
        if (ok) {
          g = ctx.geometry(ctx.padded_rows());
          for (int e = 0; e <= ctx.params.num_local_experts; ++e) smem.expert_offset[e] = __ldcg(&v.expert_offset[e]);
          for (int e = 0; e < ctx.params.num_local_experts; ++e) smem.expert_rows[e] = __ldcg(&v.expert_rows[e]);
        }
        have_schedule = true;
      }
      if (ok && ticket < protocol::task_count(g)) {
        const protocol::Task t = protocol::decode_task(g, ticket);
        task.kind = t.kind;
        task.minibatch = t.minibatch;
        task.m_tile = t.m_tile;
        task.n_tile = t.n_tile;
        switch (t.kind) {
          case TaskKind::kSharedGateUp: task.row0 = t.m_tile * g.tile_m; break;
          case TaskKind::kSharedDown:
            task.row0 = t.m_tile * g.tile_m;
            ok = protocol::wait_shared_h_ready(ctx.sync, v.counters, g, t.m_tile, ctx.rank);
            break;
          case TaskKind::kGateUp:
            task.row0 = protocol::ring_row_of_tile(g, t.m_tile);
            task.expert = expert_of_row(smem.expert_offset, ctx.params.num_local_experts, t.m_tile * g.tile_m);
            // Its x rows are in the ring, and its h slot was read by the
            // previous generation's down tasks (smaller tickets).
            ok = protocol::wait_tile_filled(ctx.sync, v.counters, g, t.m_tile, ctx.rank) &&
                 protocol::wait_h_free(ctx.sync, v.counters, g, t.minibatch, ctx.rank);
            break;
          case TaskKind::kDown:
            task.row0 = protocol::ring_row_of_tile(g, t.m_tile);
            task.expert = expert_of_row(smem.expert_offset, ctx.params.num_local_experts, t.m_tile * g.tile_m);
            ok = protocol::wait_h_ready(ctx.sync, v.counters, g, t.m_tile, ctx.rank);
            break;
          case TaskKind::kNone: break;
        }
        if (t.kind == TaskKind::kSharedGateUp || t.kind == TaskKind::kSharedDown) {
          task.real_rows = min(g.tile_m, v.tokens - task.row0);
        } else if (t.kind != TaskKind::kNone) {
          const int32_t real_end = smem.expert_offset[task.expert] + smem.expert_rows[task.expert];
          task.real_rows = min(g.tile_m, real_end - t.m_tile * g.tile_m);
        }
        if (!ok) task.kind = TaskKind::kNone;
        // What the flags guard was written by generic or bulk stores; our reads are TMA.
        fence_proxy_async_global();
        if (task.kind != TaskKind::kNone) {
          trace_record(ctx.params, TraceKind::kTaskWait, static_cast<int32_t>(task.kind), ctx.rank, wait_begin,
                       trace_now());
        }
      }
    }
    // Post the task.
    mbarrier_wait_parity(&smem.task_empty[slot], phase ^ 1u);
    smem.tasks[slot] = task;
    mbarrier_arrive(&smem.task_full[slot]);
    if (++slot == kTaskSlots) {
      slot = 0;
      phase ^= 1u;
    }
    if (task.kind == TaskKind::kNone) return;
    // Both loads complete while the operands stream (their values are used
    // only at the next task). An abort seen here ends the list there; one
    // raised later is seen by the next task's waits.
    next_ticket = protocol::take_ticket(ctx.sync, v.counters);
    aborted = ctx.sync.load_relaxed(v.counters.abort) != 0;

    // Stream its operands.
    const bool gate_up = is_gate_up(task.kind);
    const bool routed = task.kind == TaskKind::kGateUp || task.kind == TaskKind::kDown;
    GemmTile tile;
    tile.group = routed ? task.expert : 0;
    tile.row0 = task.row0;
    tile.row_end = task.row0 + g.tile_m;
    tile.n0 = task.n_tile * (gate_up ? kGateUpOutCols : kDownOutCols);
    int a_map, b_map, k;
    switch (task.kind) {
      case TaskKind::kSharedGateUp: a_map = kMapX; b_map = kMapSharedW13; k = ctx.params.hidden; break;
      case TaskKind::kSharedDown: a_map = kMapSharedH; b_map = kMapSharedW2; k = ctx.params.shared_width; break;
      case TaskKind::kGateUp: a_map = kMapRingX; b_map = kMapW13; k = ctx.params.hidden; break;
      default: a_map = kMapRingH; b_map = kMapW2; k = ctx.params.intermediate; break;
    }
    const GemmTensorMaps task_maps{&maps[a_map], &maps[b_map]};
    if (gate_up) {
      load_tile<FusedSwigluCfg>(task_maps, reinterpret_cast<GemmSharedStorage<FusedSwigluCfg>&>(smem.storage),
                                reinterpret_cast<StageRing<FusedSwigluCfg::kStages>&>(ring), tile,
                                k / FusedPlainCfg::kBlockK);
    } else {
      load_tile<FusedPlainCfg>(task_maps, smem.storage, ring, tile, k / FusedPlainCfg::kBlockK);
    }
  }
}

}  // namespace mok::device
