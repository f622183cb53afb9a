// The GEMM CTAs of the fused forward: a producer warpgroup (one thread takes
// tickets, waits for each task's inputs, posts the task to the consumers and
// streams its operands by TMA; another thread, the signaler, publishes each
// finished task's completion) and two consumer warpgroups (wgmma over the
// whole K, then the task's epilogue; they hand the task to the signaler and
// start the next one at once, so the release fences and counter atomics of a
// task overlap the next task's mainloop). The tasks
// and their order are src/protocol/forward_plan.hpp's; every wait and signal
// is a named operation of src/protocol/counters.hpp.
//
//   task            A (TMA)        B (TMA)        epilogue -> signals
//   shared gate/up  x              shared w13     silu(g)*u -> shared_h        -> shared_h_ready
//   shared down     shared_h       shared w2      bf16      -> shared_out      -> shared_done
//   gate/up         x ring         w13[expert]    silu(g)*u -> h ring          -> ring_consumed, h_ready
//   (the producer waits, before posting a task, for its inputs: shared_h_ready,
//   tile_filled + h slot free, or h_ready)
//   down            h ring         w2[expert]     bf16      -> home combine row-> h_consumed, down_done
#pragma once

#include <cstdint>

#include "device/gemm/tile_epilogue.cuh"
#include "device/gemm/tile_config.cuh"
#include "device/gemm/tile_mainloop.cuh"
#include "device/pipeline/stage_ring.cuh"
#include "device/ptx/async_copy.cuh"
#include "device/ptx/bulk_copy.cuh"
#include "device/ptx/wgmma.cuh"
#include "device/roles/role_context.cuh"
#include "device/roles/schedule_role.cuh"
#include "device/trace/trace_record.cuh"

namespace mok::device {

// Both task shapes share one shared-memory layout: 128 x 256 x 64 tiles.
using FusedPlainCfg = GemmTileConfig<128, 256, 4, EpilogueKind::kPlain>;
using FusedSwigluCfg = GemmTileConfig<128, 256, 4, EpilogueKind::kSwiGLU>;
static_assert(sizeof(GemmSharedStorage<FusedPlainCfg>) == sizeof(GemmSharedStorage<FusedSwigluCfg>));
static_assert(FusedSwigluCfg::kOutCols == kGateUpOutCols && FusedPlainCfg::kOutCols == kDownOutCols);

inline constexpr int kTaskSlots = 2;
inline constexpr int kDoneSlots = 2;  // finished tasks queued for the signaler

struct GemmTask {
  protocol::TaskKind kind;
  int32_t minibatch;
  int32_t m_tile;
  int32_t n_tile;
  int32_t expert;  // local expert of a routed task
  int32_t row0;    // first A row: ring row (routed) or token (shared)
  int32_t real_rows;  // rows of the tile that are not padding (1..tile_m)
  int32_t signal;  // finished tasks: 1 if its completion is to be published (0 after an abort)
};

struct FusedGemmShared {
  GemmSharedStorage<FusedPlainCfg> storage;
  GemmTask tasks[kTaskSlots];
  uint64_t task_full[kTaskSlots];
  uint64_t task_empty[kTaskSlots];
  // Down tasks: where each of the tile's rows goes (null: padding), by task slot.
  uint16_t* row_destination[kTaskSlots][FusedPlainCfg::kBlockM];
  uint64_t rows_ready[kTaskSlots];
  GemmTask done[kDoneSlots];
  uint64_t done_full[kDoneSlots];   // every consumer warp stored its part of the task
  uint64_t done_empty[kDoneSlots];  // the signaler took the task
  int32_t expert_offset[kMaxScheduleExperts + 1];  // the producer's copy of the rank's schedule offsets
  int32_t expert_rows[kMaxScheduleExperts];        // and of its real rows per expert
  // Trace stamps of the consumers' current task (kept here, not in registers,
  // which the accumulators need).
  uint64_t trace_task_begin, trace_mainloop_end, trace_stores_end;
};

__device__ __forceinline__ bool is_gate_up(protocol::TaskKind kind) {
  return kind == protocol::TaskKind::kGateUp || kind == protocol::TaskKind::kSharedGateUp;
}

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
    const uint64_t wait_begin = trace_now();
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

// Consumer warpgroup `consumer` (0 or 1). Returns false if the pass aborted.
template <cuda::thread_scope kScope>
__device__ __forceinline__ bool gemm_consumer(RoleContext<kScope>& ctx, FusedGemmShared& smem, int consumer) {
  using protocol::TaskKind;
  const RankView& v = ctx.view();
  const int lane = threadIdx.x % 32;
  StageRing<FusedPlainCfg::kStages> ring{smem.storage.full, smem.storage.empty};
  const protocol::ForwardGeometry shared_geometry = ctx.geometry(0);
  protocol::ForwardGeometry g = shared_geometry;
  bool have_schedule = false;
  bool ok = true;
  int slot = 0, done_slot = 0;
  uint32_t phase = 0, done_phase = 0;
  float acc[FusedPlainCfg::kAccRegs];

  for (;;) {
    mbarrier_wait_parity(&smem.task_full[slot], phase);
    const GemmTask task = smem.tasks[slot];
    // The slot (and its resolved rows) stays ours until the epilogue is done.
    const int task_slot = slot;
    const uint32_t task_phase = phase;
    if (++slot == kTaskSlots) {
      slot = 0;
      phase ^= 1u;
    }
    if (task.kind == TaskKind::kNone) {
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&smem.task_empty[task_slot]);
      // Tell the signaler the list is over (after every earlier task).
      if (lane == 0) {
        mbarrier_wait_parity(&smem.done_empty[done_slot], done_phase ^ 1u);
        if (consumer == 0 && threadIdx.x % 128 == 0) smem.done[done_slot] = task;
        mbarrier_arrive(&smem.done_full[done_slot]);
      }
      return ok;
    }
    // One thread of the CTA stamps the consumers' timeline.
    const bool tracer = ctx.params.trace != nullptr && consumer == 0 && threadIdx.x % 128 == 0;
    if (tracer) smem.trace_task_begin = trace_now();
    const bool routed = task.kind == TaskKind::kGateUp || task.kind == TaskKind::kDown;
    if (routed && !have_schedule) {
      // The producer acquired the schedule before posting this task.
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
      skip_tile<FusedPlainCfg>(ring, k / FusedPlainCfg::kBlockK);
    } else if (is_gate_up(task.kind)) {
      mma_tile<FusedSwigluCfg>(reinterpret_cast<GemmSharedStorage<FusedSwigluCfg>&>(smem.storage),
                               reinterpret_cast<StageRing<FusedSwigluCfg::kStages>&>(ring), consumer,
                               k / FusedPlainCfg::kBlockK, acc);
    } else {
      mma_tile<FusedPlainCfg>(smem.storage, ring, consumer, k / FusedPlainCfg::kBlockK, acc);
    }
    if (tracer) smem.trace_mainloop_end = trace_now();
    // Every task, not only down tasks: the resolver must be done with this
    // slot before the consumers give it back to the producer.
    mbarrier_wait_parity(&smem.rows_ready[task_slot], task_phase);

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
        // The producer waited for the h slot to be free (read by the previous
        // generation's down tasks) before posting the task.
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
      mbarrier_wait_parity(&smem.done_empty[done_slot], done_phase ^ 1u);
      if (consumer == 0 && threadIdx.x % 128 == 0) {
        smem.done[done_slot] = task;
        smem.done[done_slot].signal = ok ? 1 : 0;
      }
      mbarrier_arrive(&smem.done_full[done_slot]);
    }
    if (++done_slot == kDoneSlots) {
      done_slot = 0;
      done_phase ^= 1u;
    }
    if (tracer) {
      const uint64_t end = trace_now();
      trace_record(ctx.params, TraceKind::kMainloop, static_cast<int32_t>(task.kind), ctx.rank,
                   smem.trace_task_begin, smem.trace_mainloop_end);
      trace_record(ctx.params, TraceKind::kEpilogue, static_cast<int32_t>(task.kind), ctx.rank,
                   smem.trace_mainloop_end, smem.trace_stores_end);
      trace_record(ctx.params, TraceKind::kHandoff, static_cast<int32_t>(task.kind), ctx.rank,
                   smem.trace_stores_end, end);
    }
  }
}

// The row resolver (one warp of the producer warpgroup): for each down task
// the producer posts, looks up where each of its 128 rows goes -- the home
// rank's combine row of that (token, slot) -- while the consumers run the
// mainloop, so their epilogue does not wait on those loads. Every task gets
// a rows_ready arrival, so the consumers' phases stay in step.
template <cuda::thread_scope kScope>
__device__ __forceinline__ void gemm_row_resolver(RoleContext<kScope>& ctx, FusedGemmShared& smem) {
  using protocol::TaskKind;
  const RankView& v = ctx.view();
  const int lane = threadIdx.x % 32;
  const int H = ctx.params.hidden, top_k = ctx.params.top_k;
  int slot = 0;
  uint32_t phase = 0;
  for (;;) {
    mbarrier_wait_parity(&smem.task_full[slot], phase);
    const GemmTask task = smem.tasks[slot];
    if (task.kind == TaskKind::kNone) return;
    if (task.kind == TaskKind::kDown) {
      const RowSource* rows = v.rows + static_cast<int64_t>(task.m_tile) * ctx.params.tile_m;
      for (int i = lane; i < FusedPlainCfg::kBlockM; i += 32) {
        const RowSource src = load_row_source(&rows[i]);
        smem.row_destination[slot][i] =
            is_padding(src) ? nullptr
                            : ctx.params.ranks[src.rank].combine + (static_cast<int64_t>(src.token) * top_k + src.slot) * H;
      }
    }
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&smem.rows_ready[slot]);
    if (++slot == kTaskSlots) {
      slot = 0;
      phase ^= 1u;
    }
  }
}

// The signaler (one thread of the producer warpgroup): publishes each task
// the consumers finished, in order, then frees its queue slot. Returns when
// the consumers post the end of the task list.
template <cuda::thread_scope kScope>
__device__ __forceinline__ void gemm_signaler(RoleContext<kScope>& ctx, FusedGemmShared& smem) {
  using protocol::TaskKind;
  const RankView& v = ctx.view();
  protocol::ForwardGeometry g = ctx.geometry(0);
  bool have_schedule = false;
  int slot = 0;
  uint32_t phase = 0;
  for (;;) {
    mbarrier_wait_parity(&smem.done_full[slot], phase);
    const uint64_t begin = trace_now();
    const GemmTask task = smem.done[slot];
    const bool routed = task.kind == TaskKind::kGateUp || task.kind == TaskKind::kDown;
    if (routed && !have_schedule) {
      g = ctx.geometry(ctx.padded_rows());  // the producer acquired it before posting the task
      have_schedule = true;
    }
    if (task.signal) {
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
    }
    mbarrier_arrive(&smem.done_empty[slot]);
    if (++slot == kDoneSlots) {
      slot = 0;
      phase ^= 1u;
    }
    if (task.kind == TaskKind::kNone) return;
    trace_record(ctx.params, TraceKind::kSignal, static_cast<int32_t>(task.kind), ctx.rank, begin, trace_now());
  }
}

}  // namespace mok::device
