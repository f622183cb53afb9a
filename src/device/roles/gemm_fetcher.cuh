// The GEMM CTA's fetcher thread: tickets, decoding, input waits (gemm_role.cuh).
#pragma once

#include <cstdint>

#include "device/roles/gemm_role.cuh"

namespace mok::device {

// The local expert whose padded block holds schedule row `row`, by binary
// search over the fetcher's shared-memory copy of the expert offsets (a
// search over global memory would be a chain of dependent L2 round trips).
__device__ __forceinline__ int32_t expert_of_row(const int32_t* expert_offset, int32_t num_local, int32_t row) {
  int32_t lo = 0, hi = num_local - 1;  // answer in [lo, hi]
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (expert_offset[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Fetcher thread: takes the CTA's tickets in order, turns each into a task
// whose inputs are ready, and queues it for the producer (fetch slot). While
// the producer streams one task, the fetcher takes the next ticket and waits
// for that task's inputs, so the decode and the acquire round trips overlap
// the current task's loads instead of sitting between its last stage and the
// next task's first. Ends the queue with a kNone task when the list is
// exhausted or the pass aborts.
template <class Ctx>
__device__ __forceinline__ void gemm_fetcher(Ctx& ctx, FusedGemmShared& smem) {
  using Pass = typename Ctx::Pass;
  const auto& v = ctx.view();
  const protocol::PassGeometry<Pass> token_geometry = ctx.geometry(0);
  // The prologue's tasks (token rows) need no schedule: every later ticket does.
  const int64_t token_tasks = protocol::prologue_task_count(token_geometry);
  protocol::PassGeometry<Pass> g = token_geometry;
  bool have_schedule = false;
  SlotCursor<kFetchSlots> queued;
  for (;;) {
    // The ticket is taken only once the producer has posted the previous task
    // to the consumers and freed the slot (it streams that task now): exactly
    // where the producer alone used to take it, so a CTA holds no more
    // tickets than before; only the decode and the input waits move off the
    // producer's path. Taking it any earlier (right after queueing the
    // previous task) made the pass 21% slower: tickets held longer stretch
    // every dependency chain.
    mbarrier_wait_parity(&smem.fetch_empty[queued.slot], queued.phase ^ 1u);
    GemmTask task{protocol::kNoTask, -1, -1, -1, -1, 0, 0};
    const TraceStamp wait_begin = trace_now();
    // An abort raised elsewhere ends the list here (one raised later is seen
    // by this task's waits).
    bool ok = ctx.sync.load_relaxed(ctx.counters().abort) == 0;
    const int64_t ticket = ok ? protocol::take_ticket(ctx.sync, ctx.counters()) : -1;
    if (ok && ticket >= token_tasks && !have_schedule) {
      // A pass over a schedule an earlier pass built finds it complete.
      if constexpr (!protocol::schedule_given<Pass>()) {
        ok = protocol::wait_schedule_filled(ctx.sync, ctx.counters(), ctx.schedule_warps(), ctx.rank);
      }
      if (ok) {
        g = ctx.geometry(ctx.padded_rows());
        if constexpr (protocol::schedule_given<Pass>()) ok = protocol::require_schedule_fits(ctx.sync, ctx.counters(), g, ctx.rank);
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
      protocol::visit_kind<Pass>(t.kind, [&](auto K) {
        using Spec = protocol::KindSpec<Pass, protocol::index_of<decltype(K)>>;
        protocol::ExpertOfWork of;
        if constexpr (Spec::value.rows == protocol::Rows::kSchedule) {
          task.row0 = protocol::ring_row_of_tile(g, t.m_tile);
          task.expert = expert_of_row(smem.expert_offset, ctx.params.num_local_experts, t.m_tile * g.tile_m);
          const int32_t real_end = smem.expert_offset[task.expert] + smem.expert_rows[task.expert];
          task.real_rows = min(g.tile_m, real_end - t.m_tile * g.tile_m);
        } else if constexpr (Spec::value.rows == protocol::Rows::kExpert) {
          // K = the expert's rows; its inputs are ready once every m-tile of
          // the expert passed the kinds that signal its counter.
          task.expert = protocol::expert_of_task(g, t);
          task.row0 = smem.expert_offset[task.expert];
          task.real_rows = smem.expert_rows[task.expert];
          of = {task.expert, (smem.expert_offset[task.expert + 1] - task.row0) / g.tile_m};
        } else if constexpr (Spec::value.rows == protocol::Rows::kTokenReduce) {
          // K = the rank's tokens, all of them (none: a tile of zeros).
          task.expert = 0;
          task.row0 = 0;
          task.real_rows = v.tokens;
        } else {
          // Own tokens: the m-tile is a token tile (token_tile_m rows).
          task.row0 = t.m_tile * g.token_tile_m;
          task.real_rows = min(g.token_tile_m, v.tokens - task.row0);
        }
        ok = protocol::wait_inputs<Spec>(ctx.sync, ctx.counters(), g, t.minibatch, t.m_tile, ctx.rank, of);
      });
      if (!ok) task.kind = protocol::kNoTask;
      if (task.kind != protocol::kNoTask) {
        trace_record(ctx.params, TraceKind::kTaskWait, task.kind, ctx.rank, wait_begin, trace_now());
      }
    }
    // Queue it (release, CTA scope: the producer's wait acquires what this
    // thread acquired from the counters).
    smem.fetched[queued.slot] = task;
    mbarrier_arrive(&smem.fetch_full[queued.slot]);
    queued.advance();
    if (task.kind == protocol::kNoTask) return;
  }
}

}  // namespace mok::device
