// The fused forward: one persistent kernel for the ranks of a world that one
// GPU serves (all of them in the virtual world, one in a peer world). Block b
// serves rank first_rank + b / ctas_per_rank; of a rank's CTAs the first
// comm_ctas_per_rank build the schedule and pull the rows (dispatch), the
// others run GEMM tasks (warpgroup 0: the fetcher and producer threads, the
// signaler thread, the row-resolver warp; warpgroups 1-2: the consumers); then
// warps 4-11 of every CTA of the rank (a GEMM CTA's consumers) join the combine.
// Setup and role dispatch only: the dataflow is in the roles and in
// docs/protocol.md.
#pragma once

#include <cstdint>

#include "device/kernel/fused_forward_params.hpp"
#include "device/kernel/gemm_cta.cuh"
#include "device/pipeline/stage_ring.cuh"
#include "device/ptx/async_copy.cuh"
#include "device/ptx/wgmma.cuh"
#include "device/roles/combine_role.cuh"
#include "device/roles/dispatch_role.cuh"
#include "device/roles/gemm_role.cuh"
#include "device/roles/role_context.cuh"
#include "device/roles/schedule_role.cuh"
#include "device/trace/trace_record.cuh"
#include "device/roles/world_barrier_role.cuh"
#include "protocol/pass_forward_fp8.hpp"

namespace mok::device {

// Pass: the forward's table, or the FP8 forward's (protocol/pass_forward_fp8.hpp:
// the same roles and counters over block-scaled FP8 rings and tiles).
template <cuda::thread_scope kScope, bool kTraining, class Pass = protocol::ForwardPass>
__global__ void __launch_bounds__(kFusedThreads, 1)
    fused_forward_kernel(const __grid_constant__ FusedForwardParams params) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = aligned_dynamic_smem(smem_raw);
  RankBlock block;
  if (!start_rank_block(params, block)) return;  // SMs left over by the partition
  const int rank = block.rank, cta = block.cta;

  RoleContext<kScope, kTraining, FusedForwardParams, Pass> ctx{params, rank, {params.timeout_ns}};
  const int comm = params.comm_ctas_per_rank;
  const int warp = threadIdx.x / 32;
  // The combine: kGemmCombineWarps warps of every CTA of the rank (a GEMM
  // CTA's consumer warps, a dispatch CTA's warps of the same numbers), warp
  // w of CTA c the rank's combine warp c * kGemmCombineWarps + w - 4. The
  // same warps on every SM, so every SM sums the same share of tokens: with
  // all twelve warps of a dispatch CTA in it, a dispatch SM took 1.5x a GEMM
  // SM's tokens and ended the pass ~30 us after them (docs/perf-notes.md v27).
  constexpr int kFirstCombineWarp = kFusedWarps - kGemmCombineWarps;
  static_assert(kFirstCombineWarp == 4, "a GEMM CTA's consumer warps are warps 4..11");
  const int combine_warps = params.ctas_per_rank * kGemmCombineWarps;
  const int combine_warp = cta * kGemmCombineWarps + (warp - kFirstCombineWarp);
  // Device-ordered passes: the world barrier frames the pass (no-ops otherwise).
  if (!world_start(ctx, cta)) return world_finish<kScope>(params, kFusedWarps);

  if (cta < comm) {
    auto& dispatch_smem = *reinterpret_cast<DispatchShared*>(smem);
    const TraceStamp start = trace_now();
    const bool scheduled =
        build_schedule(ctx, *reinterpret_cast<ScheduleShared*>(smem), cta * kFusedWarps + warp, comm * kFusedWarps);
    if (threadIdx.x == 0) trace_record(params, TraceKind::kSchedule, cta, rank, start, trace_now());
    // Every copy warp enters dispatch whatever its own schedule work returned:
    // dispatch's named barriers count all of them, and its first wait sees an
    // abort for everyone at once (a warp skipping it would hang the others).
    const bool dispatched = dispatch(ctx, dispatch_smem, cta);
    if (scheduled && dispatched && warp >= kFirstCombineWarp) {
      combine(ctx, combine_warp, combine_warps, warp == kFusedWarps - 1);
    }
    world_finish<kScope>(params, kFusedWarps);
    return;
  }

  auto& gemm_smem = *reinterpret_cast<FusedGemmShared*>(smem);
  if (run_gemm_cta(ctx, gemm_smem)) {
    // The consumer warps. After an abort the combine's first waits see it and return at once.
    combine(ctx, combine_warp, combine_warps, warp == kFirstCombineWarp);
  }
  world_finish<kScope>(params, kFusedWarps);
}

}  // namespace mok::device
