// The fused backward: one persistent kernel for the ranks of a world that one
// GPU serves (docs/backward-design.md). Block b serves rank first_rank + b /
// ctas_per_rank; of a rank's CTAs the first comm_ctas_per_rank pull the dout
// and x rows of its schedule (backward_dispatch_role.cuh) and then run GEMM
// tasks too (but the first kCombineCtas, which run the combine); the others
// run the backward table's GEMM tasks from the start (gemm_cta.cuh; the table
// is src/protocol/pass_backward.hpp); every consumer warp of the rank then
// joins the combine (backward_combine_role.cuh). The schedule is the forward's (the caller's
// pass state): no CTA builds one.
// Setup and role dispatch only: the dataflow is in the roles.
#pragma once

#include <cstdint>

#include "device/kernel/fused_backward_params.hpp"
#include "device/kernel/gemm_cta.cuh"
#include "device/roles/backward_combine_role.cuh"
#include "device/roles/backward_dispatch_role.cuh"
#include "device/roles/role_context.cuh"
#include "device/roles/world_barrier_role.cuh"
#include "device/trace/trace_record.cuh"

namespace mok::device {

static_assert(kinds_share_mainloop<protocol::BackwardPass>() && kinds_share_mainloop<protocol::BackwardRecomputePass>(),
              "the backward's kinds run one tile shape");

// Dispatch CTAs that run the combine after their dispatch (the rest join the GEMMs).
inline constexpr int kCombineCtas = 2;

// Params: FusedBackwardParams (save mode) or FusedBackwardRecomputeParams.
template <cuda::thread_scope kScope, class Params>
__global__ void __launch_bounds__(kFusedThreads, 1)
    fused_backward_kernel(const __grid_constant__ Params params) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = aligned_dynamic_smem(smem_raw);
  RankBlock block;
  if (!start_rank_block(params, block)) return;  // SMs left over by the partition
  const int rank = block.rank, cta = block.cta;

  RoleContext<kScope, false, Params> ctx{params, rank, {params.timeout_ns}};
  const int comm = params.comm_ctas_per_rank;
  const int warp = threadIdx.x / 32;
  // Device-ordered passes: the world barrier frames the pass (no-ops
  // otherwise); every warp of the rank leaves through world_finish, once.
  if (!world_start(ctx, cta)) return world_finish<kScope>(params, kFusedWarps);
  if (cta < comm) {
    // A dispatch CTA pulls rows (its copy warps). The first kCombineCtas then
    // run the combine with every warp, from the end of the pipeline on, while
    // the weight gradients still run; the others become GEMM CTAs: the rows
    // are in long before the GEMM work ends (the weight gradients read no
    // new rows). All of them in the GEMMs left the whole combine for the
    // end of the pass (0.3 ms on the DeepSeek-V3 slice, docs/perf-notes.md b5).
    auto& dispatch_smem = *reinterpret_cast<DispatchShared*>(smem);
    if (cta < kCombineCtas) {
      if (warp < kCopyWarps) backward_dispatch(ctx, dispatch_smem, cta);
      backward_combine(ctx, warp == 0);
      return world_finish<kScope>(params, kFusedWarps);
    }
    if (warp < kCopyWarps) backward_dispatch(ctx, dispatch_smem, cta);
    __syncthreads();
    if (warp < kCopyWarps && threadIdx.x % 32 == 0) end_copy_warp(dispatch_smem, warp);
    __syncthreads();
  }
  // (After an abort the fetcher ends the task list at once and the combine's
  // first waits return.)
  if (run_gemm_cta(ctx, *reinterpret_cast<FusedGemmShared*>(smem))) {
    backward_combine(ctx, warp == 4);
  }
  world_finish<kScope>(params, kFusedWarps);
}

}  // namespace mok::device
