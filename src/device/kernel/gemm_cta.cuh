// What every fused kernel (forward and backward) shares: its CTA shape, its
// shared memory, and the GEMM CTA -- its barriers and the roles of its
// warpgroups (gemm_role.cuh): warpgroup 0 runs the fetcher and producer
// threads, the signaler thread and the row-resolver warp; warpgroups 1-2 are
// the consumers, which then join the pass's combine.
#pragma once

#include <cstdint>

#include "device/pipeline/stage_ring.cuh"
#include "device/ptx/async_copy.cuh"
#include "device/ptx/wgmma.cuh"
#include "device/roles/dispatch_role.cuh"
#include "device/roles/gemm_consumer.cuh"
#include "device/roles/gemm_consumer_mixed.cuh"
#include "device/roles/gemm_fetcher.cuh"
#include "device/roles/gemm_producer.cuh"
#include "device/roles/gemm_role.cuh"
#include "device/roles/gemm_row_resolver.cuh"
#include "device/roles/gemm_signaler.cuh"
#include "device/roles/schedule_role.cuh"
#include "device/trace/trace_record.cuh"

namespace mok::device {

inline constexpr int kFusedThreads = FusedGemmCfg::kThreads;  // 1 producer + 2 consumer warpgroups
inline constexpr int kFusedWarps = kFusedThreads / 32;
inline constexpr int kGemmCombineWarps = FusedGemmCfg::kConsumerWarps;  // the consumer warps join the combine
static_assert(kFusedWarps == kScheduleWarpsPerCta, "every warp of a dispatch CTA builds the schedule");

template <class A, class B>
constexpr size_t max_size() { return sizeof(A) > sizeof(B) ? sizeof(A) : sizeof(B); }

// A dispatch CTA's schedule counters and its copy slots share the memory: the
// copies start only once every schedule warp of the rank is done.
constexpr int fused_smem_bytes() {
  return static_cast<int>(max_size<FusedGemmShared, DispatchShared>() > sizeof(ScheduleShared)
                              ? max_size<FusedGemmShared, DispatchShared>()
                              : sizeof(ScheduleShared)) +
         1024;
}
// Static __shared__ words of the roles (the dispatch CTA's flags, the trace
// cursor: ptxas reports 16 bytes), with room to spare; they come out of the
// same 227 KB as the dynamic shared memory.
inline constexpr int kStaticSharedBytes = 64;
static_assert(fused_smem_bytes() + kStaticSharedBytes <= 232448,
              "the fused kernel's shared memory exceeds an H100/H200 SM's 227 KB");


// The 1 KB-aligned start of the dynamic shared memory (TMA's 128-byte
// swizzle needs the stages on 1 KB boundaries).
__device__ __forceinline__ uint8_t* aligned_dynamic_smem(uint8_t* raw) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~static_cast<uintptr_t>(1023));
}

// Which rank and which of its CTAs a block of a fused kernel serves (block b:
// rank first_rank + b / ctas_per_rank); false for a block past the
// partition's ranks (SMs it leaves over), which must return at once. Starts
// the block's trace cursor; every thread of the block calls it.
struct RankBlock {
  int rank;
  int cta;
};
template <class Params>
__device__ __forceinline__ bool start_rank_block(const Params& params, RankBlock& block) {
  const int launch_rank = static_cast<int>(blockIdx.x) / params.ctas_per_rank;
  block.cta = static_cast<int>(blockIdx.x) % params.ctas_per_rank;
  if (launch_rank >= params.launch_ranks) return false;
  if (threadIdx.x == 0) trace_begin_block();
  __syncthreads();
  block.rank = params.first_rank + launch_rank;
  return true;
}

// Every thread of a GEMM CTA: sets up its barriers, runs its role. Returns
// true on the consumer warps once their task list is over (they join the
// pass's combine), false on the producer warpgroup.
template <class Ctx>
__device__ __forceinline__ bool run_gemm_cta(Ctx& ctx, FusedGemmShared& gemm_smem) {
  using Cfg = PassGemmCfg<typename Ctx::Pass>;
  static_assert(Cfg::kThreads == kFusedThreads && Cfg::kStages == FusedGemmCfg::kStages,
                "every pass's GEMM CTA has the fused kernel's shape");
  if (threadIdx.x == 0) {
    StageRing<Cfg::kStages>::init(gemm_smem.storage.full, gemm_smem.storage.empty, Cfg::kConsumerWarps);
    for (int s = 0; s < kFetchSlots; ++s) {
      mbarrier_init(&gemm_smem.fetch_full[s], 1);
      mbarrier_init(&gemm_smem.fetch_empty[s], 1);
    }
    for (int s = 0; s < kTaskSlots; ++s) {
      mbarrier_init(&gemm_smem.task_full[s], 1);
      mbarrier_init(&gemm_smem.task_empty[s], 1);  // the signaler
      mbarrier_init(&gemm_smem.done_full[s], Cfg::kConsumerWarps);
      mbarrier_init(&gemm_smem.rows_ready[s], 1);
    }
    fence_barrier_init();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    wgmma::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) gemm_producer(ctx, gemm_smem);
    if (threadIdx.x == 32) gemm_signaler(ctx, gemm_smem);
    if (threadIdx.x / 32 == 2) gemm_row_resolver(ctx, gemm_smem);
    if (threadIdx.x == 96) gemm_fetcher(ctx, gemm_smem);
    return false;
  }
  wgmma::setmaxnreg_inc<Cfg::kConsumerRegs>();
  if constexpr (kinds_share_mainloop<typename Ctx::Pass>() || protocol::has_expert_work<typename Ctx::Pass>()) {
    gemm_consumer(ctx, gemm_smem, warpgroup - 1);
  } else {
    gemm_consumer_mixed(ctx, gemm_smem, warpgroup - 1);
  }
  return true;
}

}  // namespace mok::device
