// The GEMM CTA's producer thread: posting and TMA (gemm_role.cuh).
#pragma once

#include <cstdint>

#include "device/roles/gemm_role.cuh"

namespace mok::device {

// Producer thread: takes each task the fetcher queued (its inputs ready),
// posts it to the consumers and streams its operands by TMA. Returns after
// posting the fetcher's kNone.
template <cuda::thread_scope kScope>
__device__ __forceinline__ void gemm_producer(RoleContext<kScope>& ctx, FusedGemmShared& smem) {
  using protocol::TaskKind;
  const RankView& v = ctx.view();
  const CUtensorMap* maps = v.maps;
  StageRing<FusedPlainCfg::kStages> ring{smem.storage.full, smem.storage.empty};
  SlotCursor<kFetchSlots> fetched;
  SlotCursor<kTaskSlots> posted;
  for (;;) {
    mbarrier_wait_parity(&smem.fetch_full[fetched.slot], fetched.phase);
    const GemmTask task = smem.fetched[fetched.slot];
    // What the fetcher's flags guard was written by generic or bulk stores
    // on other SMs; it acquired them and handed the task over with a
    // release/acquire pair, and this thread's reads are TMA (async proxy).
    if (task.kind != TaskKind::kNone) fence_proxy_async_global();
    // Post the task. Only then is the fetch slot freed, which is when the
    // fetcher takes the next ticket: right after a post, where the producer
    // alone used to take it, so a CTA never holds more tickets than then.
    mbarrier_wait_parity(&smem.task_empty[posted.slot], posted.phase ^ 1u);
    smem.tasks[posted.slot] = task;
    mbarrier_arrive(&smem.task_full[posted.slot]);
    posted.advance();
    mbarrier_arrive(&smem.fetch_empty[fetched.slot]);
    fetched.advance();
    if (task.kind == TaskKind::kNone) return;

    // Stream its operands.
    const bool gate_up = is_gate_up(task.kind);
    const bool routed = task.kind == TaskKind::kGateUp || task.kind == TaskKind::kDown;
    GemmTile tile;
    tile.group = routed ? task.expert : 0;
    tile.row0 = task.row0;
    tile.row_end = task.row0 + ctx.params.tile_m;
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
