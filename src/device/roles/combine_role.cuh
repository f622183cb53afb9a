// The combine on each token's home rank, run by the same warps of every CTA
// of the rank once their own role is done (fused_forward_kernel.cuh):
//   out[t] = bf16( s[t] + sum_{j<k} w[t][j] * y[t][j] ),
// in fp32, slots in ascending order, each step one fused multiply-add
// (__fmaf_rn: the reference's fmaf), exactly as include/mok/reference.hpp.
// It first waits for the rank's shared expert and for every owner's down
// tasks (polling the owners' own counters), then warp w of the rank's W warps
// takes tokens w, w + W, ... with 16-byte loads and stores.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "device/kernel/bf16x8.cuh"
#include "device/roles/role_context.cuh"
#include "device/trace/trace_record.cuh"

namespace mok::device {

inline constexpr int kCombineBatch = 8;
inline constexpr int kCombineSpans = 2;
static_assert(kMaxTopK % kCombineBatch == 0);

// `warp` and `warps` number the participating warps of this rank.
// `tracer`: this warp stamps the trace for its CTA.
template <class Ctx>
__device__ __forceinline__ bool combine(Ctx& ctx, int warp, int warps, bool tracer) {
  const int lane = threadIdx.x % 32;
  const RankView& v = ctx.view();
  bool ok = true;
  const TraceStamp wait_begin = trace_now();
  if (lane == 0) {
    // The table's combine waits: its shared expert, then each owner's routed
    // outputs (polled on the owner's own counter, a read of peer memory).
    using Pass = typename Ctx::Pass;
    constexpr protocol::CounterWait kShared = Pass::Combine::value.waits[0];
    constexpr protocol::CounterWait kRouted = Pass::Combine::value.waits[1];
    const auto& mine = ctx.counters();
    ok = protocol::wait_counter(ctx.sync, mine.abort_view(), mine, ctx.geometry(0), kShared, 0, 0, ctx.rank, ctx.rank);
    for (int owner = 0; ok && owner < ctx.params.world_size; ++owner) {
      const auto& o = ctx.counters_of(owner);
      // The owner's padded rows are final once its schedule is; wait for that first.
      ok = protocol::wait_schedule_filled(ctx.sync, o, ctx.schedule_warps(), owner);
      if (!ok) break;
      const int32_t padded = static_cast<int32_t>(__ldcg(o.schedule_rows));
      Ctx owner_ctx{ctx.params, owner, ctx.sync};
      ok = protocol::wait_counter(ctx.sync, mine.abort_view(), o, owner_ctx.geometry(padded), kRouted, 0, 0, ctx.rank,
                                  owner);
    }
  }
  ok = __shfl_sync(0xffffffffu, ok, 0);
  __syncwarp();  // orders the other lanes' reads after lane 0's acquires
  if (!ok) return false;
  const TraceStamp work_begin = trace_now();

  const int k = ctx.params.top_k;
  const int H = ctx.params.hidden;
  const bool has_shared = ctx.params.shared_width > 0;
  for (int t = warp; t < v.tokens; t += warps) {
    float w[kMaxTopK];
#pragma unroll
    for (int j = 0; j < kMaxTopK; ++j) w[j] = j < k ? __ldg(&v.weights[static_cast<int64_t>(t) * k + j]) : 0.f;
    const uint16_t* y0 = v.combine + static_cast<int64_t>(t) * k * H;
    // Each step covers kCombineSpans spans of 256 columns (8 per lane), and
    // issues the loads of all its spans and of a batch of kCombineBatch slots
    // together: one memory latency per batch, not per slot and span. Sums
    // stay per column in slot order.
    for (int c0 = lane * 8; c0 < H; c0 += kCombineSpans * 32 * 8) {
      float acc[kCombineSpans][8];
#pragma unroll
      for (int u = 0; u < kCombineSpans; ++u) {
        const int c = c0 + u * 32 * 8;
        unpack_bf16x8(has_shared && c < H
                          ? __ldcg(reinterpret_cast<const uint4*>(v.shared_out + static_cast<int64_t>(t) * H + c))
                          : make_uint4(0, 0, 0, 0),  // +0.0 without a shared expert
                      acc[u]);
      }
#pragma unroll
      for (int j0 = 0; j0 < kMaxTopK; j0 += kCombineBatch) {
        if (j0 < k) {
          uint4 raw[kCombineSpans][kCombineBatch];
#pragma unroll
          for (int u = 0; u < kCombineSpans; ++u) {
            const int c = c0 + u * 32 * 8;
#pragma unroll
            for (int j = 0; j < kCombineBatch; ++j) {
              if (j0 + j < k && c < H) {
                raw[u][j] = __ldcg(reinterpret_cast<const uint4*>(y0 + static_cast<int64_t>(j0 + j) * H + c));
              }
            }
          }
#pragma unroll
          for (int u = 0; u < kCombineSpans; ++u) {
#pragma unroll
            for (int j = 0; j < kCombineBatch; ++j) {
              if (j0 + j < k) {
                float y[8];
                unpack_bf16x8(raw[u][j], y);
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[u][i] = __fmaf_rn(w[j0 + j], y[i], acc[u][i]);
              }
            }
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kCombineSpans; ++u) {
        const int c = c0 + u * 32 * 8;
        if (c < H) *reinterpret_cast<uint4*>(v.out + static_cast<int64_t>(t) * H + c) = pack_bf16x8(acc[u]);
      }
    }
  }
  if (tracer && lane == 0) {
    trace_record(ctx.params, TraceKind::kCombineWait, 0, ctx.rank, wait_begin, work_begin);
    trace_record(ctx.params, TraceKind::kCombine, 0, ctx.rank, work_begin, trace_now());
  }
  return true;
}

}  // namespace mok::device
