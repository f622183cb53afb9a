// The backward's combine on each token's home rank, run by every warp of the
// rank once its own role is done (docs/backward-design.md):
//   dx[t] = bf16( 0 + dx_shared[t] + dx_0[t] + ... + dx_{k-1}[t] )   fp32, slots in order
//   dweights[t][j] = part_0 + part_1 + ...                          the n-tile parts, in n-tile order
// The same arithmetic as the staged backward's row_combine and row-parts
// kernels, so the two give the same bits. dx_j of slot j lies in its owner's
// dx rows, at the schedule row the owner's dispatch wrote into dx_row_of. It first waits for the rank's
// shared expert and for every owner's dx tasks (polling the owners' own
// counters; the owner's schedule length is in its pass state). Every warp
// of the rank that runs it returns once no token is left.
#pragma once

#include <cstdint>

#include "device/kernel/bf16x8.cuh"
#include "device/roles/combine_role.cuh"
#include "device/roles/gemm_role.cuh"
#include "device/roles/role_context.cuh"
#include "device/trace/trace_record.cuh"

namespace mok::device {

// `tracer`: this warp stamps the trace for its CTA.
template <class Ctx>
__device__ __forceinline__ bool backward_combine(Ctx& ctx, bool tracer) {
  using Pass = typename Ctx::Pass;
  const int lane = threadIdx.x % 32;
  const auto& v = ctx.view();
  bool ok = true;
  const TraceStamp wait_begin = trace_now();
  if (lane == 0) {
    constexpr protocol::CounterWait shared_done = Pass::Combine::value.waits[0];
    constexpr protocol::CounterWait dx_done = Pass::Combine::value.waits[1];
    // These warps may wait from the kernel's start to the end of every
    // owner's pipeline: the deadline counts from the counter's last move.
    constexpr auto kFromProgress = protocol::Deadline::kFromProgress;
    ok = protocol::wait_counter<kFromProgress>(ctx.sync, v.counters.abort_view(), v.counters, ctx.geometry(0),
                                               shared_done, 0, 0, ctx.rank, ctx.rank);
    for (int owner = 0; ok && owner < ctx.params.world_size; ++owner) {
      const auto& o = ctx.params.ranks[owner];
      Ctx owner_ctx{ctx.params, owner, ctx.sync};
      const int32_t padded = __ldcg(&o.expert_offset[ctx.params.num_local_experts]);
      ok = protocol::wait_counter<kFromProgress>(ctx.sync, v.counters.abort_view(), o.counters,
                                                 owner_ctx.geometry(padded), dx_done, 0, 0, ctx.rank, owner);
    }
  }
  ok = __shfl_sync(0xffffffffu, ok, 0);
  __syncwarp();  // orders the other lanes' reads after lane 0's acquires
  if (!ok) return false;
  const TraceStamp work_begin = trace_now();

  const int k = ctx.params.top_k;
  const int64_t H = ctx.params.hidden;
  const bool has_shared = ctx.params.shared_width > 0;
  // The g tasks' n-tiles: one part per n-tile (gemm_consumer.cuh writes them).
  using GradCfg = KindConfig<protocol::KindSpec<Pass, Pass::kGrad>>;
  const int parts = (ctx.params.intermediate + GradCfg::kOutCols - 1) / GradCfg::kOutCols;
  // Tokens are claimed one at a time from the rank's counter, not dealt out
  // by warp index: the dispatch warps, idle from the end of the dispatch, do
  // most of the work while the GEMM warps still run the weight gradients, and
  // those join for what is left (each token's arithmetic is the same
  // whichever warp takes it).
  for (;;) {
    int t = 0;
    if (lane == 0) t = static_cast<int>(atomicAdd(v.combine_next, 1u));
    t = __shfl_sync(0xffffffffu, t, 0);
    if (t >= v.tokens) break;
    // Slot j's dx_j: the owner's dx row that its dispatch named (lane j
    // reads where; every lane gets each slot's row from it).
    const uint16_t* slot_rows[kMaxTopK];
    {
      DxRowOf at{0, 0};
      if (lane < k) {
        const int2 raw = __ldcg(reinterpret_cast<const int2*>(v.dx_row_of + static_cast<int64_t>(t) * k + lane));
        at = DxRowOf{raw.x, raw.y};
      }
#pragma unroll
      for (int j = 0; j < kMaxTopK; ++j) {
        const int owner = __shfl_sync(0xffffffffu, at.owner, j);
        const int row = __shfl_sync(0xffffffffu, at.row, j);
        slot_rows[j] = j < k ? ctx.params.ranks[owner].dx_rows + static_cast<int64_t>(row) * H : nullptr;
      }
    }
    for (int64_t c = lane * 8; c < H; c += 32 * 8) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (has_shared) add_bf16x8(acc, __ldcg(reinterpret_cast<const uint4*>(v.shared_dx + t * H + c)));
      // Every slot's load in flight before the first addition.
      uint4 raw[kMaxTopK];
#pragma unroll
      for (int j = 0; j < kMaxTopK; ++j) {
        if (j < k) raw[j] = __ldcg(reinterpret_cast<const uint4*>(slot_rows[j] + c));
      }
#pragma unroll
      for (int j = 0; j < kMaxTopK; ++j) {
        if (j < k) add_bf16x8(acc, raw[j]);
      }
      *reinterpret_cast<uint4*>(v.dx + t * H + c) = pack_bf16x8(acc);
    }
    if (lane < k) {
      const float* p = v.dw_parts + (static_cast<int64_t>(t) * k + lane) * parts;
      float sum = __ldcg(p);
      for (int i = 1; i < parts; ++i) sum = __fadd_rn(sum, __ldcg(p + i));
      v.dweights[static_cast<int64_t>(t) * k + lane] = sum;
    }
  }
  if (tracer && lane == 0) {
    trace_record(ctx.params, TraceKind::kCombineWait, 0, ctx.rank, wait_begin, work_begin);
    trace_record(ctx.params, TraceKind::kCombine, 0, ctx.rank, work_begin, trace_now());
  }
  return true;
}

}  // namespace mok::device
