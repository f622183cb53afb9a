// The forward pass of one rank, as a table (the vocabulary is
// pass_table.hpp's). This is the one file that says what the forward's GEMM
// tasks read and write, what each waits for and signals, and in which order
// the tickets hand them out; docs/protocol.md argues why the order cannot
// deadlock, and the CPU model (tests/cpu/test_pass_protocol.cpp) checks it.
//
//   kind            A          B           K   out cols  epilogue -> out         waits                      signals
//   shared gate/up  x          shared w13  H   S         SwiGLU   -> shared_h    -                          shared_h_ready
//   shared down     shared_h   shared w2   S   H         plain    -> shared_out  shared_h_ready             shared_done
//   gate/up         x ring     w13[e]      H   I         SwiGLU   -> h ring      tile_filled, h slot free   ring_consumed, h_ready
//   down            h ring     w2[e]       I   H         plain    -> home rows   h_ready                    h_consumed, down_done
//
//   dispatch of an m-tile (comm CTAs): waits for its x slot to be free, pulls the rows, signals tile_filled.
//   combine (home rank): waits for shared_done and every owner's down_done, then
//                        out = bf16(shared + sum_j w_j * y_j) in fp32, slots in order.
//
// Ticket order: the shared expert's gate/up, then its down (they overlap the
// dispatch, and need no schedule), then the routed pipeline
//   GU(0) .. GU(L-1), D(0), GU(L), D(1), GU(L+1), ..., D(M-1)
// where GU(m) / D(m) are minibatch m's gate/up / down tasks (m-tile major)
// and L the lookahead. The lookahead keeps workers busy on the next
// minibatches' gate/up while a minibatch's down tasks wait for its h; it
// needs L <= ring_slots because GU(m) waits for D(m - ring_slots) (h slot
// reuse), which must come earlier in the order.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/gemm_tile_shape.hpp"
#include "common/host_device.hpp"
#include "protocol/counters.hpp"
#include "protocol/pass_table.hpp"

namespace mok::protocol {

// The fused kernel's two tile shapes (one shared-memory layout: both are
// 128 x 256 x 64 bf16 tiles).
inline constexpr GemmTileShape kForwardSwiGLUTile{128, 256, EpilogueKind::kSwiGLU};
inline constexpr GemmTileShape kForwardPlainTile{128, 256, EpilogueKind::kPlain};

struct ForwardPass {
  enum Kind : int32_t { kSharedGateUp, kSharedDown, kGateUp, kDown, kNumKinds };
  enum Counter : int32_t {
    kTileFilled,    // per ring tile: its rows are in the x ring (stored by the one dispatch worker)
    kRingConsumed,  // per ring slot: gate/up tasks done reading the x slot
    kHReady,        // per ring tile: gate/up tasks that stored their h columns
    kHConsumed,     // per ring slot: down tasks done reading the h slot
    kSharedHReady,  // per token tile: shared gate/up tasks that stored their shared_h columns
    kSharedDone,    // shared down tasks done (the combine reads shared_out)
    kDownDone,      // down tasks whose y rows are in their home ranks' rows
    kNumCounters
  };

  static constexpr CounterSpec kCounters[kNumCounters] = {
      {static_cast<uint32_t>(CounterId::kTileFilled), Span::kRingTile, true},
      {static_cast<uint32_t>(CounterId::kRingConsumed), Span::kRingSlot, false},
      {static_cast<uint32_t>(CounterId::kHReady), Span::kRingTile, false},
      {static_cast<uint32_t>(CounterId::kHConsumed), Span::kRingSlot, false},
      {static_cast<uint32_t>(CounterId::kSharedHReady), Span::kTokenTile, false},
      {static_cast<uint32_t>(CounterId::kSharedDone), Span::kWhole, false},
      {static_cast<uint32_t>(CounterId::kDownDone), Span::kWhole, false},
  };

  static constexpr TaskKindSpec kKinds[kNumKinds] = {
      // kSharedGateUp
      {kForwardSwiGLUTile, Tensor::kX, Tensor::kSharedW13, Dim::kHidden, Dim::kSharedWidth, Rows::kTokens,
       Tensor::kSharedH, {}, {{kSharedHReady}}},
      // kSharedDown
      {kForwardPlainTile, Tensor::kSharedH, Tensor::kSharedW2, Dim::kSharedWidth, Dim::kHidden, Rows::kTokens,
       Tensor::kSharedOut, {{kSharedHReady, Await::kReady}}, {{kSharedDone}}},
      // kGateUp: its x rows are in the ring, and its h slot was read by the
      // previous generation's down tasks (smaller tickets).
      {kForwardSwiGLUTile, Tensor::kRingX, Tensor::kW13, Dim::kHidden, Dim::kIntermediate, Rows::kSchedule,
       Tensor::kRingH, {{kTileFilled, Await::kReady}, {kHConsumed, Await::kFree}}, {{kRingConsumed}, {kHReady}}},
      // kDown: every gate/up task of its m-tile stored its h columns.
      {kForwardPlainTile, Tensor::kRingH, Tensor::kW2, Dim::kIntermediate, Dim::kHidden, Rows::kSchedule,
       Tensor::kHomeCombine, {{kHReady, Await::kReady}}, {{kHConsumed}, {kDownDone}}},
  };

  static constexpr int32_t kPrologue[] = {kSharedGateUp, kSharedDown};
  static constexpr PipelineEntry kPipeline[] = {{kDown, true}, {kGateUp, false}};

  // Dispatch of one m-tile: its x slot's previous generation was read by
  // every gate/up task; then its rows are announced.
  struct Dispatch {
    static constexpr RoleSpec value = {{{kRingConsumed, Await::kFree}}, {{kTileFilled}}, {Tensor::kRingX}};
  };
  // The combine on the home rank: its shared expert, then every owner's down
  // tasks (waits[1] is polled on each owner's counters).
  struct Combine {
    static constexpr RoleSpec value = {{{kSharedDone, Await::kReady}, {kDownDone, Await::kReady}},
                                       {},
                                       {},
                                       {Tensor::kHomeCombine, Tensor::kSharedOut}};
  };
};

static_assert(pass_table_is_consistent<ForwardPass>(), "the forward's table breaks a rule of pass_table.hpp");

using ForwardGeometry = PassGeometry<ForwardPass>;
using ForwardCounters = PassCounters<ForwardPass>;

MOK_HD ForwardGeometry forward_geometry(const PassShape& s, int32_t tokens, int32_t padded_rows) {
  return pass_geometry<ForwardPass>(s, tokens, padded_rows);
}

// ---- the forward's non-GEMM roles, by name ---------------------------------
// For the forward's table and the tables that keep its dispatch and combine
// by deriving from it (the FP8 forward's, pass_forward_fp8.hpp).
template <class Pass>
concept ForwardTable = std::is_base_of_v<ForwardPass, Pass>;

// Dispatch, before filling m-tile `m_tile`'s rows.
MOK_EXEC_CHECK_DISABLE
template <class Sync, ForwardTable Pass>
MOK_HD bool wait_ring_free(Sync& s, const PassCounters<Pass>& c, const PassGeometry<Pass>& g, int32_t m_tile,
                           int32_t rank) {
  return wait_inputs<typename Pass::Dispatch>(s, c, g, m_tile / g.tiles_per_minibatch(), m_tile, rank);
}
// Dispatch, after the m-tile's rows are in the ring (copies complete and visible).
MOK_EXEC_CHECK_DISABLE
template <class Sync, ForwardTable Pass>
MOK_HD void signal_tile_filled(Sync& s, const PassCounters<Pass>& c, const PassGeometry<Pass>& g, int32_t m_tile) {
  signal_outputs<typename Pass::Dispatch>(s, c, g, m_tile / g.tiles_per_minibatch(), m_tile);
}
// Combine, on the home rank: its shared expert's output is complete.
MOK_EXEC_CHECK_DISABLE
template <class Sync, ForwardTable Pass>
MOK_HD bool wait_shared_done(Sync& s, const PassCounters<Pass>& c, const PassGeometry<Pass>& g, int32_t rank) {
  constexpr CounterWait w = Pass::Combine::value.waits[0];
  return wait_counter(s, c.abort_view(), c, g, w, 0, 0, rank, rank);
}
// Combine: polls the owner's own counter (a read of peer memory; no remote
// atomics): once it reaches the owner's total, every y row the owner made is
// in place.
MOK_EXEC_CHECK_DISABLE
template <class Sync, ForwardTable Pass>
MOK_HD bool wait_down_done(Sync& s, const PassCounters<Pass>& waiter, const PassCounters<Pass>& owner_counters,
                           const PassGeometry<Pass>& owner_geometry, int32_t waiter_rank, int32_t owner_rank) {
  constexpr CounterWait w = Pass::Combine::value.waits[1];
  return wait_counter(s, waiter.abort_view(), owner_counters, owner_geometry, w, 0, 0, waiter_rank, owner_rank);
}

}  // namespace mok::protocol
