// The GEMM CTA's consumer warpgroups: mainloop, epilogue, handoff (gemm_role.cuh).
#pragma once

#include <cstdint>

#include "device/gemm/tile_epilogue_swiglu_quantize.cuh"
#include "device/roles/consumer_stall.cuh"
#include "device/roles/gemm_role.cuh"
#include "protocol/ring_scales.hpp"

namespace mok::device {

// Training mode: a SwiGLU task also keeps its raw gate and up accumulators
// (bf16) where the caller asked -- routed rows by schedule row, the shared
// expert's by token; padding rows and rows past the tokens are not written.
// n = I or S: the gate columns of the tile go to [col0, ...), the up columns
// to [n + col0, ...) of the row.
template <class Spec, class View>
__device__ __forceinline__ void store_preactivations(const View& v, const SavedPreactivations& saved,
                                                     GemmSharedStorage<KindConfig<Spec>>& storage,
                                                     const float (&acc)[KindConfig<Spec>::kAccRegs], int consumer,
                                                     const GemmTask& task, int32_t n) {
  using Cfg = KindConfig<Spec>;
  constexpr bool kRouted = Spec::value.rows == protocol::Rows::kSchedule;
  uint16_t* const base = kRouted ? saved.routed : saved.shared;
  if (base == nullptr) return;  // not training, or this expert's activations are not kept
  const int col0 = task.n_tile * Cfg::kOutCols;
  // A routed task's tile is m-tile m_tile of the schedule (tile_m = BM rows).
  const int64_t first = kRouted ? static_cast<int64_t>(task.m_tile) * Cfg::kBlockM : task.row0;
  const int32_t real = kRouted ? task.real_rows : v.tokens - task.row0;
  for (int up = 0; up < 2; ++up) {
    store_tile_rows_of<Cfg>([&](int j, int h) { return preactivation_pair<Cfg>(acc, j, h, up != 0); }, storage,
                            consumer, col0, n, [&](int i) -> uint16_t* {
                              return i < real ? base + (first + i) * 2 * n + up * n : nullptr;
                            });
  }
}

// The backward's g tasks (g = dout . W2, SwiGLU backward in the epilogue):
// [da | db] and w h of the tile's rows, and the row's part of the router
// weight's gradient for this n-tile. Routed rows are schedule rows (weight
// w of the row, parts to the home rank's (token, slot)); the shared
// expert's are token rows (weight 1, no parts: it has no router weight).
template <class Spec, class Ctx>
__device__ __forceinline__ void store_swiglu_backward_output(const Ctx& ctx,
                                                             GemmSharedStorage<KindConfig<Spec>>& storage,
                                                             const float (&acc)[KindConfig<Spec>::kAccRegs],
                                                             int consumer, const GemmTask& task, int32_t n_cols) {
  using Cfg = KindConfig<Spec>;
  const auto& v = ctx.view();
  constexpr bool kRouted = Spec::value.rows == protocol::Rows::kSchedule;
  GemmTile tile;
  tile.group = kRouted ? task.expert : 0;
  tile.row0 = task.row0;  // routed: the schedule row (the backward's buffers never wrap)
  tile.row_end = task.row0 + task.real_rows;
  tile.n0 = task.n_tile * Cfg::kOutCols;
  SwigluBackwardOutputs o;
  o.n = n_cols;
  o.parts = nullptr;
  o.parts_cols = (n_cols + Cfg::kOutCols - 1) / Cfg::kOutCols;
  if constexpr (kRouted) {
    o.preact = v.preact;
    o.row_scale = v.w_rows;
    o.d13 = v.d13_rows;
    o.scaled_act = v.hw_rows;
    const int top_k = ctx.params.top_k;
    store_swiglu_backward_tile<Cfg>(acc, storage, consumer, tile, o, [&](int row) -> float* {
      const RowSource src = load_row_source(&v.rows[row]);
      return ctx.params.ranks[src.rank].dw_parts +
             (static_cast<int64_t>(src.token) * top_k + src.slot) * o.parts_cols + task.n_tile;
    });
  } else {
    o.preact = v.shared_preact;
    o.row_scale = nullptr;
    o.d13 = v.shared_d13;
    o.scaled_act = v.shared_h;
    store_swiglu_backward_tile<Cfg>(acc, storage, consumer, tile, o, [](int) -> float* { return nullptr; });
  }
}

// Stores a finished task's tile where its kind says: rows the rank owns (a
// ring's rows, all of them; or its own tokens, those that exist), or rows of
// home ranks that the row resolver looked up during the mainloop.
// A bf16 weight-gradient tile whose K loop kept its last stage (`held`) is
// stored from there by TMA (store_weight_grad_tile_async), and so is a dx_j
// tile (store_tile_boxes_async), whose K loop always keeps it.
template <class Spec, class Ctx>
__device__ __forceinline__ void store_task_output(const Ctx& ctx, FusedGemmShared& smem,
                                                  const float (&acc)[KindConfig<Spec>::kAccRegs], int consumer,
                                                  const GemmTask& task, int task_slot, int32_t n_cols,
                                                  const HeldStage& held) {
  using Cfg = KindConfig<Spec>;
  const auto& v = ctx.view();
  auto& storage = reinterpret_cast<GemmSharedStorage<Cfg>&>(smem.storage);
  const int col0 = task.n_tile * Cfg::kOutCols;
  const int32_t row0 = task.row0;
  if constexpr (Cfg::kEpilogue == EpilogueKind::kSwiGLUQuantize) {
    // The FP8 forward's gate/up: h quantized into the ring's e4m3 rows and
    // their scales. A split-N tile's two warpgroups hand each other half
    // their accumulators through the consumer warps' staging, in two rounds
    // (the fused shared memory has no room for the grouped GEMM's 32 KB area).
    static_assert(Spec::value.out == protocol::Tensor::kRingH);
    GemmTile tile;
    tile.group = task.expert;
    tile.row0 = row0;
    tile.row_end = row0 + task.real_rows;
    tile.n0 = col0;
    uint8_t* const values = reinterpret_cast<uint8_t*>(v.ring_h);
    // h's scales in the ring go k-block-major (protocol/ring_scales.hpp): the
    // tile's 128 columns are one block, whose rows are adjacent bytes.
    const int64_t pitch =
        protocol::ring_scale_pitch(static_cast<int64_t>(ctx.params.ring_slots) * ctx.params.minibatch_rows);
    const ScaleColumn scales{ctx.params.fp8[ctx.rank].ring_h_scales, 1,
                             protocol::ring_scale_index(0, col0 / 128, pitch)};
    if constexpr (Cfg::kSplitN) {
      static_assert(Cfg::kExchangeFloats / 2 * sizeof(float) == sizeof(storage.staging), "a round fills the staging");
      store_swiglu_quantize_tile<Cfg, 2>(acc, storage, reinterpret_cast<float*>(&storage.staging[0][0]), consumer,
                                         tile, values, scales, n_cols, kBarrierFusedExchange);
    } else {
      // The wide tile: each warpgroup has gate and up of its own rows.
      store_swiglu_quantize_wide_tile<Cfg>(acc, storage, consumer, tile, values, scales, n_cols);
    }
  } else if constexpr (Cfg::kEpilogue == EpilogueKind::kGateUpPreact) {
    // The recompute backward's gate/up: [gate | up] rounded once to bf16, as
    // the forward's training mode keeps it (the same K loop over the same
    // rows, so the same bits), into the pass's own buffers.
    store_preactivations<Spec>(v, SavedPreactivations{v.kept_preact, v.kept_shared_preact}, storage, acc, consumer,
                               task, n_cols);
  } else if constexpr (Cfg::kEpilogue == EpilogueKind::kSwiGLUBackward) {
    store_swiglu_backward_output<Spec>(ctx, storage, acc, consumer, task, n_cols);
  } else if constexpr (protocol::reduces_rows(Spec::value.rows)) {
    // A weight gradient: the expert's [m, n] matrix (the shared expert's: its one matrix).
    const int32_t m = protocol::dim_of(ctx.shape(), Spec::value.m);
    void* const base = weight_grad_base<Spec::value.out>(v);
    const int64_t first = static_cast<int64_t>(task.expert) * m * n_cols;
    const WeightGradTile tile = weight_grad_tile_of<Spec>(task, ctx.shape());
    if (held.stage >= 0) {
      const CUtensorMap* out_map = v.maps + protocol::output_map<typename Ctx::Pass>(Spec::value.out);
      store_weight_grad_tile_async<Cfg>(acc, storage, consumer, tile, out_map, m, n_cols, held,
                                        kBarrierFusedWeightGradClear);
    } else if (ctx.params.weight_grad_bf16 != 0) {  // an empty expert's zeros
      store_empty_weight_grad_tile<Cfg>(consumer, tile, static_cast<uint16_t*>(base) + first, m, n_cols);
    } else {
      store_weight_grad_tile<Cfg>(acc, storage, consumer, tile, static_cast<float*>(base) + first, m, n_cols,
                                  ctx.params.accumulate != 0);
    }
  } else if constexpr (Spec::value.out == protocol::Tensor::kDxRows) {
    // dx_j by schedule row (the backward's buffers never wrap): each
    // warpgroup its 64 rows, those past the tile's real rows included (the
    // expert's padding rows: no one reads them); an idle warpgroup stores
    // nothing but meets the barriers.
    const CUtensorMap* out_map = v.maps + protocol::output_map<typename Ctx::Pass>(Spec::value.out);
    store_tile_boxes_async<Cfg>(acc, storage, consumer, out_map, col0, row0 + consumer * 64, n_cols,
                                consumer * 64 < task.real_rows, held, kBarrierFusedWeightGradClear);
  } else if constexpr (Spec::value.out == protocol::Tensor::kHomeCombine) {
    uint16_t* const* destinations = smem.row_destination[task_slot];
    store_tile_rows<Cfg>(acc, storage, consumer, col0, n_cols, [&](int i) -> uint16_t* { return destinations[i]; });
  } else if constexpr (Spec::value.rows == protocol::Rows::kTokens) {
    uint16_t* const base = output_base<Spec::value.out>(v);
    const int32_t tokens = v.tokens;
    store_tile_rows<Cfg>(acc, storage, consumer, col0, n_cols, [&](int i) -> uint16_t* {
      return row0 + i < tokens ? base + static_cast<int64_t>(row0 + i) * n_cols : nullptr;
    });
  } else {
    uint16_t* const base = output_base<Spec::value.out>(v);
    store_tile_rows<Cfg>(acc, storage, consumer, col0, n_cols, [&](int i) -> uint16_t* {
      return base + static_cast<int64_t>(row0 + i) * n_cols;
    });
  }
  if constexpr (Ctx::kTraining && Cfg::kEpilogue == EpilogueKind::kSwiGLU) {
    store_preactivations<Spec>(v, ctx.params.saved[ctx.rank], storage, acc, consumer, task, n_cols);
  }
}

// The next task from the producer (every consumer thread), with the slot
// (and its resolved rows) that stays the consumers' until the epilogue is
// done, and that slot's phase.
struct TakenTask {
  GemmTask task;
  int slot;
  uint32_t phase;
};
template <class OnStall>
__device__ __forceinline__ TakenTask take_task(FusedGemmShared& smem, SlotCursor<kTaskSlots>& tasks,
                                               const OnStall& on_stall) {
  mbarrier_wait_parity(&smem.task_full[tasks.slot], tasks.phase, on_stall);
  const TakenTask taken{smem.tasks[tasks.slot], tasks.slot, tasks.phase};
  tasks.advance();
  return taken;
}

// The end of the task list (every consumer thread): its slot to the
// signaler, which takes the end after every earlier task and returns.
__device__ __forceinline__ void end_task_list(FusedGemmShared& smem, int task_slot) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) mbarrier_arrive(&smem.done_full[task_slot]);
}

// After a task's epilogue (every consumer thread): the task to the signaler
// (which frees its slot for the producer once it has published it), the
// task's trace. Each warp orders its generic stores before later async-proxy
// (TMA) reads on other SMs where there are any, then arrives; the arrival
// (release, CTA scope) and the signaler's wait (acquire) put these stores
// before the signaler's release of the counters. Outputs read with plain
// loads (home rows, shared_out) skip the (costly) proxy fence, which by
// elimination is what waits for the warp's stores (a plain arrival after
// stores does not, docs/perf-notes.md v15). One barrier operation per warp
// (the hand-off took ~5,000 cycles with three; v12, v13).
template <class Ctx>
__device__ __forceinline__ void hand_off_task(Ctx& ctx, FusedGemmShared& smem, const GemmTask& task, int task_slot,
                                              bool output_read_by_tma, bool tracer) {
  const int lane = threadIdx.x % 32;
  if (tracer) smem.trace_stores_end = trace_now();
  if (output_read_by_tma) fence_proxy_async_global();
  __syncwarp();
  if (lane == 0) mbarrier_arrive(&smem.done_full[task_slot]);
  if (tracer) {
    const TraceStamp end = trace_now();
    trace_record(ctx.params, TraceKind::kMainloop, task.kind, ctx.rank, smem.trace_task_begin,
                 smem.trace_mainloop_end);
    trace_record(ctx.params, TraceKind::kEpilogue, task.kind, ctx.rank, smem.trace_mainloop_end,
                 smem.trace_stores_end);
    trace_record(ctx.params, TraceKind::kHandoff, task.kind, ctx.rank, smem.trace_stores_end, end);
  }
}

// Consumer warpgroup `consumer` (0 or 1). Returns at the end of the task list
// (an aborted pass ends it early); a barrier stall never returns
// (consumer_stall.cuh).
template <class Ctx>
__device__ __forceinline__ void gemm_consumer(Ctx& ctx, FusedGemmShared& smem, int consumer) {
  using Pass = typename Ctx::Pass;
  using MainCfg = PassGemmCfg<Pass>;  // the one mainloop shape of the pass's GEMM kinds
  const protocol::PassShape shape = ctx.shape();
  auto& storage = reinterpret_cast<GemmSharedStorage<MainCfg>&>(smem.storage);
  StageRing<MainCfg::kStages> ring{storage.full, storage.empty};
  SlotCursor<kTaskSlots> tasks;
  float acc[MainCfg::kAccRegs];
  // The stage a box-stored tile's TMA store still reads (the next
  // weight-gradient tile's K loop hands it back, or the next task of another
  // kind before its K loop; tile_store_async.cuh).
  HeldStage held;
  // The previous task signals late (protocol::signals_late): its stores must
  // be complete before this task's hand-off.
  bool late_stores = false;
  // Every barrier wait of the consumers ends a stall this way, never by a
  // trap.
  const ConsumerFaultOnStall on_stall(ctx.params.timeout_ns);

  for (;;) {
    const auto [task, task_slot, task_phase] = take_task(smem, tasks, on_stall);
    if (task.kind == protocol::kNoTask) {
      // The last box-stored tile's writes complete before the consumers leave
      // the GEMM work (and the CTA, its shared memory), and before the
      // signaler publishes a late-signalled task (its stores are complete).
      if ((held.stage >= 0 || late_stores) && issues_box_stores()) {
        bulk_wait_all();
        fence_proxy_async_global();
      }
      release_held_stage(ring, held);
      end_task_list(smem, task_slot);
      return;
    }
    // One thread of the CTA stamps the consumers' timeline.
    const bool tracer = ctx.params.trace != nullptr && consumer == 0 && threadIdx.x % 128 == 0;
    if (tracer) smem.trace_task_begin = trace_now();

    // What the kind says of its mainloop: K only (every kind runs the one
    // mainloop shape, gemm_role.cuh), and whether TMA reads its output later.
    int32_t k = 0, n_cols = 0;
    bool output_read_by_tma = false, per_expert = false, b_mn = false, late = false;
    protocol::visit_kind<Pass>(task.kind, [&](auto K) {
      constexpr protocol::TaskKindSpec spec = Pass::kKinds[protocol::index_of<decltype(K)>];
      k = protocol::dim_of(shape, spec.k);
      n_cols = protocol::dim_of(shape, spec.n);
      output_read_by_tma = protocol::read_by_tma<Pass>(spec.out) || protocol::read_by_tma<Pass>(spec.also_out);
      per_expert = protocol::reduces_rows(spec.rows);
      b_mn = spec.tile.b_major == OperandMajor::kMN;
      late = protocol::signals_late(spec.out);
    });
    // A warpgroup whose 64 rows are all padding (an expert's last tile, half
    // full or less) computes and stores nothing; the other one runs alone.
    // (A weight-gradient tile's rows are output rows: both always run, and
    // meet at a barrier when they clear the rows past the expert.)
    const bool idle = !per_expert && consumer * 64 >= task.real_rows;
    if constexpr (protocol::has_expert_work<Pass>()) {
      if (per_expert) {
        protocol::visit_kind<Pass>(task.kind, [&](auto K) {
          using Spec = protocol::KindSpec<Pass, protocol::index_of<decltype(K)>>;
          if constexpr (protocol::reduces_rows(Spec::value.rows)) {
            using Cfg = KindConfig<Spec>;
            mma_weight_grad_tile<Cfg>(reinterpret_cast<GemmSharedStorage<Cfg>&>(smem.storage), ring, consumer,
                                      weight_grad_tile_of<Spec>(task, shape), acc, kBarrierFusedWeightGradClear,
                                      held, ctx.params.weight_grad_bf16 != 0, on_stall);
          }
        });
      }
    }
    // Another kind after a box-stored tile (a dx_j tile, or a weight-gradient
    // tile): its held stage goes back once this K loop has issued its second
    // k-block, as mma_weight_grad_tile does (the store has had a k-block's
    // time to read it, and the producer has a k-block's time to refill it),
    // or at the end of a shorter loop. Then no warp's epilogue reuses the
    // staging area before every warp's store has read it (a barrier below).
    HeldStage earlier = per_expert ? HeldStage{} : held;
    if (!per_expert) held.stage = -1;
    const bool hands_back = earlier.stage >= 0;
    const auto hand_back_after = [&](int kb) {
      if (kb == 1) release_held_stage(ring, earlier);
    };
    // A late-signalled tile (dx_j) keeps its last stage for its TMA store.
    if (per_expert) {
    } else if (idle) {
      held.stage = skip_tile<MainCfg>(ring, k / MainCfg::kBlockK, on_stall, late, hand_back_after);
    } else if constexpr (kinds_mix_b_major<Pass>()) {
      using MNCfg = MainloopCfg<Pass, OperandMajor::kMN>;
      using KCfg = MainloopCfg<Pass, OperandMajor::kK>;
      if (b_mn) {
        held.stage = mma_tile<MNCfg>(reinterpret_cast<GemmSharedStorage<MNCfg>&>(smem.storage), ring, consumer,
                                     k / MainCfg::kBlockK, acc, on_stall, late, hand_back_after);
      } else {
        held.stage = mma_tile<KCfg>(reinterpret_cast<GemmSharedStorage<KCfg>&>(smem.storage), ring, consumer,
                                    k / MainCfg::kBlockK, acc, on_stall, late, hand_back_after);
      }
    } else {
      held.stage = mma_tile<MainCfg>(storage, ring, consumer, k / MainCfg::kBlockK, acc, on_stall, late,
                                     hand_back_after);
    }
    if (hands_back) {
      release_held_stage(ring, earlier);  // a loop of fewer than two k-blocks
      named_barrier_sync(kBarrierFusedWeightGradClear, 128 * MainCfg::kConsumerWarpgroups);
    }
    if (tracer) smem.trace_mainloop_end = trace_now();
    // Every task, not only those going home: the resolver must be done with
    // this slot before the consumers give it back to the producer.
    mbarrier_wait_parity(&smem.rows_ready[task_slot], task_phase, on_stall);
    // The previous task's late stores are complete (they have had this
    // task's K loop to drain) before this task is handed off: the signaler
    // publishes that task with this one (gemm_signaler.cuh).
    if (late_stores && issues_box_stores()) {
      bulk_wait_all();
      fence_proxy_async_global();
    }
    late_stores = late;

    if (!idle || late) {
      protocol::visit_kind<Pass>(task.kind, [&](auto K) {
        store_task_output<protocol::KindSpec<Pass, protocol::index_of<decltype(K)>>>(ctx, smem, acc, consumer, task,
                                                                                      task_slot, n_cols, held);
      });
    }
    hand_off_task(ctx, smem, task, task_slot, output_read_by_tma, tracer);
  }
}

}  // namespace mok::device
