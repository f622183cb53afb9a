// The GEMM CTA's producer thread: posting and TMA (gemm_role.cuh).
#pragma once

#include <cstdint>

#include "device/roles/gemm_role.cuh"
#include "protocol/ring_scales.hpp"

namespace mok::device {

// An FP8 kind's A scales, copied into each stage's slot with the stage: the
// tile's rows of its ring's scale array (x's for gate/up, h's for down).
template <class Spec, class Ctx>
__device__ __forceinline__ RingScaleStageCopy<kFusedStages, FusedGemmCfg::kBlockM> ring_scale_copy(
    const Ctx& ctx, FusedGemmShared& smem, int32_t row0) {
  static_assert(Spec::value.a == protocol::Tensor::kRingX || Spec::value.a == protocol::Tensor::kRingH,
                "an FP8 kind's A is a ring, whose scales are the rank's (Fp8RankOperands)");
  static_assert(KindConfig<Spec>::kBlockM == FusedGemmCfg::kBlockM, "a slot holds the tile's rows");
  const Fp8RankOperands& q = ctx.params.fp8[ctx.rank];
  const uint8_t* scales = Spec::value.a == protocol::Tensor::kRingX ? q.ring_x_scales : q.ring_h_scales;
  const int32_t pitch = static_cast<int32_t>(
      protocol::ring_scale_pitch(static_cast<int64_t>(ctx.params.ring_slots) * ctx.params.minibatch_rows));
  return {&smem.a_scales, scales + protocol::ring_scale_index(row0, 0, pitch), pitch};
}

// Producer thread: takes each task the fetcher queued (its inputs ready),
// posts it to the consumers and streams its operands by TMA. Returns after
// posting the fetcher's kNone.
template <class Ctx>
__device__ __forceinline__ void gemm_producer(Ctx& ctx, FusedGemmShared& smem) {
  using Pass = typename Ctx::Pass;
  const auto& v = ctx.view();
  const CUtensorMap* maps = v.maps;
  const protocol::PassShape shape = ctx.shape();
  StageRing<PassGemmCfg<Pass>::kStages> ring{smem.storage.full, smem.storage.empty};
  SlotCursor<kFetchSlots> fetched;
  SlotCursor<kTaskSlots> posted;
  for (;;) {
    mbarrier_wait_parity(&smem.fetch_full[fetched.slot], fetched.phase);
    const GemmTask task = smem.fetched[fetched.slot];
    // What the fetcher's flags guard was written by generic or bulk stores
    // on other SMs; it acquired them and handed the task over with a
    // release/acquire pair, and this thread's reads are TMA (async proxy).
    if (task.kind != protocol::kNoTask) fence_proxy_async_global();
    // Post the task. Only then is the fetch slot freed, which is when the
    // fetcher takes the next ticket: right after a post, where the producer
    // alone used to take it, so a CTA never holds more tickets than then.
    mbarrier_wait_parity(&smem.task_empty[posted.slot], posted.phase ^ 1u);
    smem.tasks[posted.slot] = task;
    mbarrier_arrive(&smem.task_full[posted.slot]);
    posted.advance();
    mbarrier_arrive(&smem.fetch_empty[fetched.slot]);
    fetched.advance();
    if (task.kind == protocol::kNoTask) return;

    // Stream its operands: the kind's A and B, over its K.
    protocol::visit_kind<Pass>(task.kind, [&](auto K) {
      constexpr int32_t kKind = protocol::index_of<decltype(K)>;
      using Spec = protocol::KindSpec<Pass, kKind>;
      using Cfg = KindConfig<Spec>;
      const GemmTensorMaps task_maps{&maps[protocol::map_index<Pass>(kKind, 0)],
                                     &maps[protocol::map_index<Pass>(kKind, 1)]};
      auto& storage = reinterpret_cast<GemmSharedStorage<Cfg>&>(smem.storage);
      if constexpr (protocol::reduces_rows(Spec::value.rows)) {
        load_weight_grad_tile<Cfg>(task_maps, storage, ring, weight_grad_tile_of<Spec>(task, shape));
      } else {
        GemmTile tile;
        tile.group = Spec::value.rows == protocol::Rows::kSchedule ? task.expert : 0;
        tile.row0 = task.row0;
        tile.row_end = task.row0 + (Spec::value.rows == protocol::Rows::kTokens ? protocol::token_tile_of(shape)
                                                                                 : ctx.params.tile_m);
        tile.n0 = task.n_tile * Cfg::kOutCols;
        const int k_blocks = protocol::dim_of(shape, Spec::value.k) / Cfg::kBlockK;
        if constexpr (Cfg::kElement == ElementType::kE4M3) {
          load_tile<Cfg>(task_maps, storage, ring, tile, k_blocks, ring_scale_copy<Spec>(ctx, smem, tile.row0));
        } else {
          load_tile<Cfg>(task_maps, storage, ring, tile, k_blocks);
        }
      }
    });
  }
}

}  // namespace mok::device
