// The GEMM CTAs of the fused kernel: a producer warpgroup (a fetcher thread
// takes the next ticket and waits for its task's inputs while the producer
// thread streams the current task's operands by TMA, then hands it over; the
// signaler thread publishes each finished task's completion; the
// row-resolver warp finds where a task's rows go when they go to home
// ranks) and two consumer warpgroups (wgmma over the whole K, then the task's
// epilogue; they hand the task to the signaler and start the next one at
// once, so the release fences and counter atomics of a task overlap the next
// task's mainloop). What each task kind reads, writes, waits for and signals,
// and the ticket order, are the pass table's (src/protocol/pass_forward.hpp
// for the forward); the roles walk the table and hold no knowledge of any
// kind. This file holds what the roles share (tile configs, the task record,
// the CTA's shared memory and its queues); each role has its own file:
// gemm_fetcher.cuh, gemm_producer.cuh, gemm_consumer.cuh,
// gemm_row_resolver.cuh, gemm_signaler.cuh.
#pragma once

#include <cstdint>

#include "device/gemm/fp8_stage_scales.cuh"
#include "device/gemm/tile_epilogue.cuh"
#include "device/gemm/tile_epilogue_swiglu_backward.cuh"
#include "device/gemm/tile_config.cuh"
#include "device/gemm/tile_mainloop.cuh"
#include "device/gemm/weight_grad_tile.cuh"
#include "device/pipeline/slot_cursor.cuh"
#include "device/pipeline/stage_ring.cuh"
#include "device/ptx/async_copy.cuh"
#include "device/ptx/bulk_copy.cuh"
#include "device/ptx/wgmma.cuh"
#include "device/roles/role_context.cuh"
#include "device/roles/schedule_role.cuh"
#include "device/trace/trace_record.cuh"

namespace mok::device {

inline constexpr int kFusedStages = 4;

// The fused kernels' stage: the bf16 128 x 256 tile's (A 16 KB + B 32 KB).
// A kind whose stage is smaller (the FP8 forward's 64 x 256 tiles: 8 + 32 KB)
// strides its stages by this too, so that every kind of a pass sees stage s
// at the same address and the barriers after the stages at the same offset.
inline constexpr int kFusedStageStride = (128 + 256) * 128;
constexpr int stage_stride_of(GemmTileShape t) {
  return (t.block_m + t.block_n) * 128 == kFusedStageStride ? 0 : kFusedStageStride;
}

// The device tile configuration of a task kind (Spec = protocol::KindSpec):
// its shape is the table's, so the n-tile width the protocol counts and the
// one the epilogue stores are one number.
template <class Spec>
using KindConfig = GemmTileConfig<Spec::value.tile.block_m, Spec::value.tile.block_n, kFusedStages,
                                  Spec::value.tile.epilogue, Spec::value.tile.element, Spec::value.tile.b_major,
                                  Spec::value.tile.a_major, 1, stage_stride_of(Spec::value.tile)>;

// Every kind of a fused pass runs one mainloop shape: one shared-memory
// stage layout, one accumulator array and one wgmma instruction shape (a
// row's bits must not depend on its task's kind's code path). The epilogue
// is the kind's own.
template <class Pass>
using PassGemmCfg = KindConfig<protocol::KindSpec<Pass, 0>>;
using FusedGemmCfg = PassGemmCfg<protocol::ForwardPass>;
template <class Pass>
constexpr bool kinds_share_mainloop() {
  bool same = true;
  protocol::for_each_index<Pass::kNumKinds>([&](auto K) {
    constexpr GemmTileShape t = Pass::kKinds[K].tile;
    same = same && t.block_m == PassGemmCfg<Pass>::kBlockM && t.block_n == PassGemmCfg<Pass>::kBlockN &&
           t.element == PassGemmCfg<Pass>::kElement;
  });
  // One stage layout in bytes: FusedGemmShared holds the forward's.
  return same && sizeof(GemmSharedStorage<PassGemmCfg<Pass>>) == sizeof(GemmSharedStorage<FusedGemmCfg>);
}
static_assert(kinds_share_mainloop<protocol::ForwardPass>(), "the fused kernel runs one mainloop shape");

// A K loop depends on the tile shape and on how B lies in memory (K- or
// MN-major: the wgmma's transpose bit and the stage's descriptor), never on
// the epilogue. A pass whose row kinds read B both ways -- the recompute
// backward: W13 K-major for the recomputed gate/up, MN-major for the data
// gradients -- runs one of two loops per task; every other pass keeps its
// one (kind 0's) loop.
template <class Pass, OperandMajor kB>
using MainloopCfg = GemmTileConfig<PassGemmCfg<Pass>::kBlockM, PassGemmCfg<Pass>::kBlockN, kFusedStages,
                                   EpilogueKind::kPlain, PassGemmCfg<Pass>::kElement, kB>;
template <class Pass>
constexpr bool kinds_mix_b_major() {
  bool mixed = false;
  protocol::for_each_index<Pass::kNumKinds>([&](auto K) {
    constexpr protocol::TaskKindSpec spec = Pass::kKinds[K];
    if (!protocol::reduces_rows(spec.rows) && spec.tile.b_major != PassGemmCfg<Pass>::kBMajor) mixed = true;
  });
  return mixed;
}
static_assert(!kinds_mix_b_major<protocol::ForwardPass>());

inline constexpr int kFetchSlots = 1;  // tasks fetched ahead of the producer (gemm_fetcher.cuh)
inline constexpr int kTaskSlots = 2;

struct GemmTask {
  int32_t kind;       // the pass's task kind, or protocol::kNoTask (end of the list)
  int32_t minibatch;  // schedule-row tasks
  int32_t m_tile;
  int32_t n_tile;
  int32_t expert;     // local expert of a schedule-row or per-expert task
  int32_t row0;       // first A row: ring row (schedule rows) or token; per expert: its first schedule row
  int32_t real_rows;  // rows of the tile that are not padding (1..tile_m); per expert: its rows (K, may be 0)
};

struct FusedGemmShared {
  GemmSharedStorage<FusedGemmCfg> storage;
  GemmTask fetched[kFetchSlots];
  uint64_t fetch_full[kFetchSlots];   // the fetcher queued a task whose inputs are ready
  uint64_t fetch_empty[kFetchSlots];  // the producer posted it to the consumers
  // A task slot's life: the producer posts a task (task_full), the consumers
  // run it and each consumer warp arrives on done_full after its epilogue's
  // stores; the signaler then publishes the task (reading it from the slot)
  // and frees the slot (task_empty). One barrier operation per consumer warp
  // and task: after a synchronous epilogue every such operation waits for the
  // warp's stores to leave the SM (docs/perf-notes.md v12).
  GemmTask tasks[kTaskSlots];
  uint64_t task_full[kTaskSlots];
  uint64_t task_empty[kTaskSlots];  // the signaler published the slot's task
  uint64_t done_full[kTaskSlots];   // every consumer warp stored its part of the slot's task
  // Tasks whose rows go to home ranks: where each row goes (null: padding), by task slot.
  uint16_t* row_destination[kTaskSlots][FusedGemmCfg::kBlockM];
  uint64_t rows_ready[kTaskSlots];
  int32_t expert_offset[kMaxScheduleExperts + 1];  // the fetcher's copy of the rank's schedule offsets
  int32_t expert_rows[kMaxScheduleExperts];        // and of its real rows per expert
  // Trace stamps of the consumers' current task (kept here, not in registers,
  // which the accumulators need).
  TraceStamp trace_task_begin, trace_mainloop_end, trace_stores_end;
  // The FP8 forward's scales (gemm/fp8_stage_scales.cuh), unused by the bf16
  // passes; last, so that nothing before them moves. A's, a slot per stage,
  // filled with the stage; B's, a table per task slot, filled by the row
  // resolver before its rows_ready arrival (roles/fp8_task_scales.cuh).
  StageScaleSlots<kFusedStages, FusedGemmCfg::kBlockM> a_scales;
  TileBScalePairs b_scales[kTaskSlots];
};

// The base of a task's output tensor in its rank's view, and its rows.
template <protocol::Tensor kOut, class View>
__device__ __forceinline__ uint16_t* output_base(const View& v) {
  static_assert(kOut == protocol::Tensor::kRingH || kOut == protocol::Tensor::kSharedH ||
                    kOut == protocol::Tensor::kSharedOut || kOut == protocol::Tensor::kSharedDx,
                "a tensor the rank owns (home rows are resolved per row)");
  if constexpr (kOut == protocol::Tensor::kRingH) return v.ring_h;
  if constexpr (kOut == protocol::Tensor::kSharedH) return v.shared_h;
  if constexpr (kOut == protocol::Tensor::kSharedOut) return v.shared_out;
  if constexpr (kOut == protocol::Tensor::kSharedDx) return v.shared_dx;
  return nullptr;
}

// Where a weight-gradient kind's output goes in its rank's view.
template <protocol::Tensor kOut, class View>
__device__ __forceinline__ void* weight_grad_base(const View& v) {
  static_assert(kOut == protocol::Tensor::kWeightGrad13 || kOut == protocol::Tensor::kWeightGrad2 ||
                kOut == protocol::Tensor::kSharedWeightGrad13 || kOut == protocol::Tensor::kSharedWeightGrad2);
  if constexpr (kOut == protocol::Tensor::kWeightGrad13) return v.dw13;
  if constexpr (kOut == protocol::Tensor::kWeightGrad2) return v.dw2;
  if constexpr (kOut == protocol::Tensor::kSharedWeightGrad13) return v.dshared_w13;
  return v.dshared_w2;
}

// The output tile of a per-expert (weight-gradient) task: its m-tile counts
// the expert's output row tiles, expert-major (protocol::decode_task), and
// its K is the expert's schedule rows from its first one.
template <class Spec>
__device__ __forceinline__ WeightGradTile weight_grad_tile_of(const GemmTask& task, const protocol::PassShape& shape) {
  using Cfg = KindConfig<Spec>;
  const int32_t per_expert = (protocol::dim_of(shape, Spec::value.m) + Cfg::kBlockM - 1) / Cfg::kBlockM;
  WeightGradTile tile;
  tile.group = task.expert;
  tile.m0 = (task.m_tile - task.expert * per_expert) * Cfg::kBlockM;
  tile.n0 = task.n_tile * Cfg::kOutCols;
  tile.row0 = task.row0;
  tile.rows = task.real_rows;
  return tile;
}

// Rows of the tile of the pass's kind whose rows go to home ranks (the row
// resolver looks that many up per task).
template <class Pass>
constexpr int home_rows_per_task() {
  int rows = 0;
  for (int k = 0; k < Pass::kNumKinds; ++k) {
    if (Pass::kKinds[k].out == protocol::Tensor::kHomeCombine) rows = Pass::kKinds[k].tile.block_m;
  }
  return rows;
}

// The width of a kind's output rows when they go to home ranks (the row
// resolver finds where), else 0.
template <class Pass>
__device__ __forceinline__ int64_t home_row_width(int32_t kind, const protocol::PassShape& shape) {
  int64_t width = 0;
  protocol::visit_kind<Pass>(kind, [&](auto K) {
    if (Pass::kKinds[K].out == protocol::Tensor::kHomeCombine) width = protocol::dim_of(shape, Pass::kKinds[K].n);
  });
  return width;
}

}  // namespace mok::device
