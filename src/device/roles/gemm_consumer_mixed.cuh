// The GEMM CTA's consumer warpgroups for a pass whose kinds run different
// mainloops: the FP8 forward (protocol/pass_forward_fp8.hpp), whose shared
// expert runs the bf16 128 x 256 tiles and whose routed kinds run
// block-scaled FP8 128 x 256 wide tiles (gemm/fp8_mainloop.cuh). The same
// queues and hand-offs as gemm_consumer.cuh, which the single-mainloop
// passes keep (so their code is unchanged); here each kind declares its own
// accumulators inside its branch, so that the registers of one kind's
// accumulators (and the FP8 loop's two partial sums) are never live in
// another's.
#pragma once

#include <cstdint>

#include "device/gemm/fp8_mainloop.cuh"
#include "device/gemm/tile_epilogue_swiglu_quantize.cuh"
#include "device/roles/fp8_task_scales.cuh"
#include "device/roles/gemm_consumer.cuh"

namespace mok::device {

template <class Ctx>
__device__ __forceinline__ void gemm_consumer_mixed(Ctx& ctx, FusedGemmShared& smem, int consumer) {
  using Pass = typename Ctx::Pass;
  static_assert(!protocol::has_expert_work<Pass>(), "weight-gradient kinds run gemm_consumer.cuh's loop");
  const protocol::PassShape shape = ctx.shape();
  // Every kind's stages sit where the fused layout puts them (KindConfig's
  // stage stride), and its barriers after them: one ring for all.
  StageRing<kFusedStages> ring{smem.storage.full, smem.storage.empty};
  SlotCursor<kTaskSlots> tasks;
  const ConsumerFaultOnStall on_stall(ctx.params.timeout_ns);

  for (;;) {
    const auto [task, task_slot, task_phase] = take_task(smem, tasks, on_stall);
    if (task.kind == protocol::kNoTask) {
      end_task_list(smem, task_slot);
      return;
    }
    const bool tracer = ctx.params.trace != nullptr && consumer == 0 && threadIdx.x % 128 == 0;
    if (tracer) smem.trace_task_begin = trace_now();

    bool output_read_by_tma = false;
    protocol::visit_kind<Pass>(task.kind, [&](auto K) {
      using Spec = protocol::KindSpec<Pass, protocol::index_of<decltype(K)>>;
      using Cfg = KindConfig<Spec>;
      static_assert(sizeof(GemmSharedStorage<Cfg>) == sizeof(GemmSharedStorage<FusedGemmCfg>) &&
                        offsetof(GemmSharedStorage<Cfg>, full) == offsetof(GemmSharedStorage<FusedGemmCfg>, full) &&
                        offsetof(GemmSharedStorage<Cfg>, staging) ==
                            offsetof(GemmSharedStorage<FusedGemmCfg>, staging) &&
                        Cfg::kStages == kFusedStages,
                    "every kind of the pass sees the fused shared-memory layout");
      auto& storage = reinterpret_cast<GemmSharedStorage<Cfg>&>(smem.storage);
      const int32_t k = protocol::dim_of(shape, Spec::value.k);
      const int32_t n_cols = protocol::dim_of(shape, Spec::value.n);
      output_read_by_tma =
          protocol::read_by_tma<Pass>(Spec::value.out) || protocol::read_by_tma<Pass>(Spec::value.also_out);
      // A split-N tile's warpgroups share its rows: both always compute. A
      // row-split one's second warpgroup idles on a tile half padding.
      const bool idle = !Cfg::kSplitN && consumer * 64 >= task.real_rows;
      float acc[Cfg::kAccRegs];
      if (idle) {
        skip_tile<Cfg>(ring, k / Cfg::kBlockK, on_stall);
      } else {
        if constexpr (Cfg::kElement == ElementType::kE4M3) {
          // B's scales: the slot's table, once the row resolver has staged it.
          mbarrier_wait_parity(&smem.rows_ready[task_slot], task_phase, on_stall);
          mma_fp8_tile<Cfg, true, 1>(storage, ring, consumer, fp8_tile_of<Cfg>(task), fp8_scales_of<Spec>(ctx), acc,
                                     on_stall, shared_address(&smem.a_scales),
                                     shared_address(&smem.b_scales[task_slot]));
        } else {
          // acc defined before its wgmma chain starts (their first overwrites
          // it, so the values do not matter): left undefined here, ptxas found
          // "non-wgmma instructions defining accumulator registers" inside the
          // chain and serialised every wgmma of the kernel, the FP8 kinds'
          // too (C7515; a wait after each of them).
#pragma unroll
          for (int i = 0; i < Cfg::kAccRegs; ++i) acc[i] = 0.0f;
          mma_tile<Cfg>(storage, ring, consumer, k / Cfg::kBlockK, acc, on_stall);
        }
      }
      if (tracer) smem.trace_mainloop_end = trace_now();
      mbarrier_wait_parity(&smem.rows_ready[task_slot], task_phase, on_stall);
      if (!idle) store_task_output<Spec>(ctx, smem, acc, consumer, task, task_slot, n_cols, HeldStage{});
    });
    hand_off_task(ctx, smem, task, task_slot, output_read_by_tma, tracer);
  }
}

}  // namespace mok::device
