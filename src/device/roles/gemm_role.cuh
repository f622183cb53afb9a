// The GEMM CTAs of the fused forward: a producer warpgroup (a fetcher thread
// takes the next ticket and waits for its task's inputs while the producer
// thread streams the current task's operands by TMA, then hands it over; the
// signaler thread publishes each finished task's completion; the
// row-resolver warp finds where a down task's rows go) and two consumer
// warpgroups (wgmma over the whole K, then the task's epilogue; they hand the
// task to the signaler and start the next one at once, so the release fences
// and counter atomics of a task overlap the next task's mainloop). The tasks
// and their order are src/protocol/forward_plan.hpp's; every wait and signal
// is a named operation of src/protocol/counters.hpp. This file holds what the
// roles share (tile configs, the task record, the CTA's shared memory and its
// queues); each role has its own file: gemm_fetcher.cuh, gemm_producer.cuh,
// gemm_consumer.cuh, gemm_row_resolver.cuh, gemm_signaler.cuh.
//
//   task            A (TMA)        B (TMA)        epilogue -> signals
//   shared gate/up  x              shared w13     silu(g)*u -> shared_h        -> shared_h_ready
//   shared down     shared_h       shared w2      bf16      -> shared_out      -> shared_done
//   gate/up         x ring         w13[expert]    silu(g)*u -> h ring          -> ring_consumed, h_ready
//   down            h ring         w2[expert]     bf16      -> home combine row-> h_consumed, down_done
//
// Before queueing a task the fetcher waits for its inputs: nothing (shared
// gate/up), shared_h_ready, tile_filled and the h slot free, or h_ready.
#pragma once

#include <cstdint>

#include "device/gemm/tile_epilogue.cuh"
#include "device/gemm/tile_config.cuh"
#include "device/gemm/tile_mainloop.cuh"
#include "device/pipeline/slot_cursor.cuh"
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

inline constexpr int kFetchSlots = 1;  // tasks fetched ahead of the producer (gemm_fetcher.cuh)
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
};

struct FusedGemmShared {
  GemmSharedStorage<FusedPlainCfg> storage;
  GemmTask fetched[kFetchSlots];
  uint64_t fetch_full[kFetchSlots];   // the fetcher queued a task whose inputs are ready
  uint64_t fetch_empty[kFetchSlots];  // the producer posted it to the consumers
  GemmTask tasks[kTaskSlots];
  uint64_t task_full[kTaskSlots];
  uint64_t task_empty[kTaskSlots];
  // Down tasks: where each of the tile's rows goes (null: padding), by task slot.
  uint16_t* row_destination[kTaskSlots][FusedPlainCfg::kBlockM];
  uint64_t rows_ready[kTaskSlots];
  GemmTask done[kDoneSlots];
  uint64_t done_full[kDoneSlots];   // every consumer warp stored its part of the task
  uint64_t done_empty[kDoneSlots];  // the signaler took the task
  int32_t expert_offset[kMaxScheduleExperts + 1];  // the fetcher's copy of the rank's schedule offsets
  int32_t expert_rows[kMaxScheduleExperts];        // and of its real rows per expert
  // Trace stamps of the consumers' current task (kept here, not in registers,
  // which the accumulators need).
  TraceStamp trace_task_begin, trace_mainloop_end, trace_stores_end;
};

__device__ __forceinline__ bool is_gate_up(protocol::TaskKind kind) {
  return kind == protocol::TaskKind::kGateUp || kind == protocol::TaskKind::kSharedGateUp;
}

}  // namespace mok::device
