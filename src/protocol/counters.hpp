// The counters of one rank and the named signal/wait operations on them.
// Roles never touch a raw atomic: they call these functions, whose names say
// which counter moves and whose bodies fix the memory order. The scope (one
// GPU, or the whole system for peers over NVLink) is the Sync backend's.
//
// A Sync backend provides, over uint32_t words:
//   load_acquire(p), store_release(p, v), add_release(p, v),
//   fetch_add_relaxed(p, v) -> old, compare_exchange(p, expected, desired) -> bool,
//   load_relaxed(p), start_clock() -> clock, expired(clock) -> bool, pause();
// and, for the world barrier of device-ordered passes (world_barrier.hpp),
//   fetch_add_acq_rel(p, v) -> old, store_relaxed(p, v).
// src/protocol/host_sync.hpp is the host one (the CPU model of the protocol);
// the device one lives beside the megakernel.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstdint>

#include "common/host_device.hpp"
#include "protocol/pass_table.hpp"

namespace mok::protocol {

enum class CounterId : uint32_t {
  kNone = 0,
  kTileFilled = 1,
  kRingConsumed = 2,
  kHReady = 3,
  kHConsumed = 4,
  kSharedHReady = 5,
  kSharedDone = 6,
  kDownDone = 7,
  kScheduleCounted = 8,
  kScheduleFilled = 9,
  kBadRouting = 10,  // not a counter: a routing entry the schedule rejected
  kWorldStarted = 11,   // world_barrier.hpp: a rank waited for a peer to start the pass
  kWorldFinished = 12,  // world_barrier.hpp: a rank waited for a peer to finish the pass
  kScheduleScanned = 13,
  kBadWeight = 14,  // not a counter: a routing weight that is NaN or infinite
  // The backward's (pass_backward.hpp):
  kExpertRowsDone = 15,  // every row of a local expert is through
  kRowsFilled = 16,      // an m-tile's dout and x rows are in place
  kD13Ready = 17,        // an m-tile's [da | db] columns are stored
  kDxDone = 18,          // an owner's dx rows are in their home rows
  kSharedD13Ready = 19,  // a token tile's shared [da | db] columns are stored
  kScheduleOverflow = 20,  // not a counter: a given schedule longer than the pass's buffers (the backward's)
  kPreactReady = 21,       // recompute mode: an m-tile's [gate | up] columns are stored
  kSharedPreactReady = 22, // recompute mode: a token tile's shared [gate | up] columns are stored
  kSharedGradDone = 23,    // every shared g task is done (the shared expert's weight gradients' inputs)
};

inline const char* counter_name(CounterId id) {
  switch (id) {
    case CounterId::kNone: return "none";
    case CounterId::kTileFilled: return "tile_filled";
    case CounterId::kRingConsumed: return "ring_consumed";
    case CounterId::kHReady: return "h_ready";
    case CounterId::kHConsumed: return "h_consumed";
    case CounterId::kSharedHReady: return "shared_h_ready";
    case CounterId::kSharedDone: return "shared_done";
    case CounterId::kDownDone: return "down_done";
    case CounterId::kScheduleCounted: return "schedule_counted";
    case CounterId::kScheduleFilled: return "schedule_filled";
    case CounterId::kBadRouting: return "bad routing entry";
    case CounterId::kBadWeight: return "non-finite routing weight";
    case CounterId::kExpertRowsDone: return "expert_rows_done";
    case CounterId::kRowsFilled: return "rows_filled";
    case CounterId::kD13Ready: return "d13_ready";
    case CounterId::kDxDone: return "dx_done";
    case CounterId::kSharedD13Ready: return "shared_d13_ready";
    case CounterId::kScheduleOverflow: return "schedule longer than the buffers";
    case CounterId::kPreactReady: return "preact_ready";
    case CounterId::kSharedPreactReady: return "shared_preact_ready";
    case CounterId::kSharedGradDone: return "shared_grad_done";
    case CounterId::kScheduleScanned: return "schedule_scanned";
    case CounterId::kWorldStarted: return "world_started";
    case CounterId::kWorldFinished: return "world_finished";
  }
  return "unknown";
}

// Written once, by the first wait that times out; the host turns it into an error.
struct StallReport {
  uint32_t counter;   // CounterId; 0 while nothing stalled
  int32_t waiter;     // rank whose worker waited
  int32_t owner;      // rank that owns the counter
  int32_t index;      // element of the counter array
  uint32_t target;
  uint32_t observed;
};

// Where a wait that gives up records why, and the flag that stops the pass:
// the world's shared pair in a pass (so that one stall stops every rank), a
// rank's own pair in the world barrier.
struct AbortView {
  uint32_t* abort;     // nonzero once any wait of the world gave up
  StallReport* stall;  // the first report
};

// One rank's counters for a pass of type Pass. All live in that rank's memory
// and start at zero: the pass's own counters (Pass::kCounters, carved in
// table order), the GEMM ticket, the schedule builders' counters, and the
// abort flag and stall report.
template <class Pass>
struct PassCounters {
  uint32_t* counter[Pass::kNumCounters];
  uint32_t* ticket;            // [1] next GEMM task
  uint32_t* schedule_counted;  // [1] schedule warps whose chunk is counted
  uint32_t* schedule_scanned;  // [1] local experts whose chunk offsets and total are known
  uint32_t* schedule_filled;   // [1] schedule warps whose chunk's rows are written
  // [1] the schedule's padded rows, written with the schedule (before
  // schedule_filled): what a peer reads of it, so the schedule itself may sit
  // in a caller's pass state the peers cannot see.
  uint32_t* schedule_rows;
  uint32_t* abort;             // [1] nonzero once any wait of the world gave up
  StallReport* stall;          // [1]

  MOK_HD AbortView abort_view() const { return {abort, stall}; }
};

// Words of uint32_t the counters take; the caller zeroes them before a pass.
template <class Pass>
MOK_HD size_t counter_words(const PassGeometry<Pass>& g) {
  size_t words = 6 + sizeof(StallReport) / sizeof(uint32_t);  // ticket, schedule x4, abort; the report
  for_each_index<Pass::kNumCounters>(
      [&](auto C) { words += static_cast<size_t>(counter_length(g, Pass::kCounters[C].span)); });
  return words;
}

// Carves the counters out of `words` (counter_words(g) zeroed words). The
// stall report and abort flag given here are the world's shared ones when
// not null, so that one stall stops every rank.
template <class Pass>
MOK_HD PassCounters<Pass> carve_counters(const PassGeometry<Pass>& g, uint32_t* words,
                                         uint32_t* world_abort = nullptr, StallReport* world_stall = nullptr) {
  PassCounters<Pass> c;
  for_each_index<Pass::kNumCounters>([&](auto C) {
    c.counter[C] = words;
    words += counter_length(g, Pass::kCounters[C].span);
  });
  c.ticket = words++;
  c.schedule_counted = words++;
  c.schedule_scanned = words++;
  c.schedule_filled = words++;
  c.schedule_rows = words++;
  c.abort = world_abort != nullptr ? world_abort : words;
  ++words;
  c.stall = world_stall != nullptr ? world_stall : reinterpret_cast<StallReport*>(words);
  return c;
}

// Records a failed wait in the stall report (the first one wins) and raises
// the abort flag.
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD void record_stall(Sync& sync, AbortView waiter_view, CounterId id, int32_t waiter, int32_t owner,
                         int32_t index, uint32_t target, uint32_t observed) {
  StallReport* report = waiter_view.stall;
  if (sync.compare_exchange(&report->counter, 0u, static_cast<uint32_t>(id))) {
    report->waiter = waiter;
    report->owner = owner;
    report->index = index;
    report->target = target;
    report->observed = observed;
  }
  sync.store_release(waiter_view.abort, 1u);
}

// When a wait gives up.
enum class Deadline : int32_t {
  kFromStart,     // timeout after the wait began
  kFromProgress,  // timeout after the counter last moved: for a wait on a
                  // whole pass's tasks (the backward's combine waits from
                  // the kernel's start for every dx_j of every owner), which
                  // a long but healthy pass must not turn into a stall
};

// Spins until *counter >= target. Returns false when the pass is aborting:
// another wait timed out, or this one did (then it records the stall first).
MOK_EXEC_CHECK_DISABLE
template <Deadline kDeadline = Deadline::kFromStart, class Sync>
MOK_HD bool wait_at_least(Sync& sync, AbortView waiter_view, const uint32_t* counter, uint32_t target, CounterId id,
                          int32_t waiter, int32_t owner, int32_t index) {
  auto clock = sync.start_clock();
  [[maybe_unused]] uint32_t last = 0;
  if constexpr (kDeadline == Deadline::kFromProgress) last = sync.load_acquire(counter);
  for (;;) {
    const uint32_t observed = sync.load_acquire(counter);
    if (observed >= target) return true;
    if (sync.load_relaxed(waiter_view.abort) != 0) return false;
    if constexpr (kDeadline == Deadline::kFromProgress) {
      if (observed != last) {
        last = observed;
        clock = sync.start_clock();
        sync.pause();
        continue;
      }
    }
    if (sync.expired(clock)) {
      record_stall(sync, waiter_view, id, waiter, owner, index, target, observed);
      return false;
    }
    sync.pause();
  }
}

// ---- the pass's counters, as its table says ---------------------------------
// Which local expert a piece of work belongs to, for per-expert counters
// (pass_table.hpp, Span::kExpert): the expert, and its schedule m-tiles
// (what a per-expert target counts). The forward has no such counter.
struct ExpertOfWork {
  int32_t expert = -1;
  int32_t schedule_m_tiles = 0;
};

// A per-expert counter touched without naming a local expert is a bug in the
// caller (an index of -1 would hit the previous counter's last word and a
// target of 0 pass at once): stop rather than corrupt the pass.
template <class Pass>
MOK_HD void require_expert(const PassGeometry<Pass>& g, const ExpertOfWork& of) {
  if constexpr (has_expert_work<Pass>()) {
    if (of.expert < 0 || of.expert >= g.local_experts) {
#if defined(__CUDA_ARCH__)
      __trap();
#else
      std::abort();
#endif
    }
  }
}

// The work on (minibatch, m_tile) -- a GEMM task, or a role's share -- waits
// for `w` on `owner`'s counters (its own, or a peer's polled over NVLink; no
// remote atomics) laid out by `owner_geometry`.
MOK_EXEC_CHECK_DISABLE
template <Deadline kDeadline = Deadline::kFromStart, class Sync, class Pass>
MOK_HD bool wait_counter(Sync& s, AbortView waiter, const PassCounters<Pass>& owner_counters,
                         const PassGeometry<Pass>& owner_geometry, CounterWait w, int32_t minibatch, int32_t m_tile,
                         int32_t waiter_rank, int32_t owner_rank, ExpertOfWork of = {}) {
  bool ok = true;
  visit_kind_from<0, Pass::kNumCounters>(w.counter, [&](auto C) {
    constexpr CounterSpec spec = Pass::kCounters[C];
    if constexpr (spec.span == Span::kExpert) require_expert(owner_geometry, of);
    const int32_t index = counter_index(owner_geometry, spec.span, minibatch, m_tile, of.expert);
    const uint32_t generation = span_cycles(spec.span) ? owner_geometry.generation_of(minibatch) : 0u;
    ok = wait_at_least<kDeadline>(s, waiter, owner_counters.counter[C] + index,
                       wait_target(owner_geometry, w, generation, of.schedule_m_tiles),
                       static_cast<CounterId>(spec.report_id), waiter_rank, owner_rank, index);
  });
  return ok;
}
// After the work on (minibatch, m_tile) is done and its outputs visible.
MOK_EXEC_CHECK_DISABLE
template <class Sync, class Pass>
MOK_HD void signal_counter(Sync& s, const PassCounters<Pass>& c, const PassGeometry<Pass>& g, int32_t counter,
                           int32_t minibatch, int32_t m_tile, ExpertOfWork of = {}) {
  visit_kind_from<0, Pass::kNumCounters>(counter, [&](auto C) {
    constexpr CounterSpec spec = Pass::kCounters[C];
    if constexpr (spec.span == Span::kExpert) require_expert(g, of);
    uint32_t* word = c.counter[C] + counter_index(g, spec.span, minibatch, m_tile, of.expert);
    if constexpr (spec.stores_generation) {
      s.store_release(word, g.generation_of(minibatch) + 1u);
    } else {
      s.add_release(word, 1u);
    }
  });
}

// The waits of a task kind or role (Spec::value: KindSpec, or a pass's role
// spec type), in table order, on the rank's own counters.
MOK_EXEC_CHECK_DISABLE
template <class Spec, class Sync, class Pass>
MOK_HD bool wait_inputs(Sync& s, const PassCounters<Pass>& c, const PassGeometry<Pass>& g, int32_t minibatch,
                        int32_t m_tile, int32_t rank, ExpertOfWork of = {}) {
  bool ok = true;
  for_each_index<kMaxWaits>([&](auto I) {
    constexpr CounterWait w = Spec::value.waits[I];
    if constexpr (w.counter != kNoCounter) {
      if (ok) ok = wait_counter(s, c.abort_view(), c, g, w, minibatch, m_tile, rank, rank, of);
    }
  });
  return ok;
}
// Its signals, in table order.
MOK_EXEC_CHECK_DISABLE
template <class Spec, class Sync, class Pass>
MOK_HD void signal_outputs(Sync& s, const PassCounters<Pass>& c, const PassGeometry<Pass>& g, int32_t minibatch,
                           int32_t m_tile, ExpertOfWork of = {}) {
  for_each_index<kMaxSignals>([&](auto I) {
    constexpr CounterSignal signal = Spec::value.signals[I];
    if constexpr (signal.counter != kNoCounter) signal_counter(s, c, g, signal.counter, minibatch, m_tile, of);
  });
}

// ---- the schedule (built inside the pass, per rank) -------------------------
// W schedule warps each count one chunk of the world's routing entries; then
// one warp per local expert scans its chunk counts; then every warp writes its
// chunk's rows (src/device/roles/schedule_role.cuh).
MOK_EXEC_CHECK_DISABLE
template <class Sync, class Counters>
MOK_HD void signal_schedule_counted(Sync& s, const Counters& c) {
  s.add_release(c.schedule_counted, 1u);
}
MOK_EXEC_CHECK_DISABLE
template <class Sync, class Counters>
MOK_HD bool wait_schedule_counted(Sync& s, const Counters& c, int32_t schedule_warps, int32_t rank) {
  return wait_at_least(s, c.abort_view(), c.schedule_counted, static_cast<uint32_t>(schedule_warps), CounterId::kScheduleCounted,
                       rank, rank, 0);
}
MOK_EXEC_CHECK_DISABLE
template <class Sync, class Counters>
MOK_HD void signal_schedule_scanned(Sync& s, const Counters& c, uint32_t experts) {
  s.add_release(c.schedule_scanned, experts);
}
MOK_EXEC_CHECK_DISABLE
template <class Sync, class Counters>
MOK_HD bool wait_schedule_scanned(Sync& s, const Counters& c, int32_t num_local, int32_t rank) {
  return wait_at_least(s, c.abort_view(), c.schedule_scanned, static_cast<uint32_t>(num_local), CounterId::kScheduleScanned,
                       rank, rank, 0);
}
MOK_EXEC_CHECK_DISABLE
template <class Sync, class Counters>
MOK_HD void signal_schedule_filled(Sync& s, const Counters& c) {
  s.add_release(c.schedule_filled, 1u);
}
// Every reader of the schedule (dispatch, routed GEMM tasks, combines reading
// an owner's padded size) waits for this.
MOK_EXEC_CHECK_DISABLE
template <class Sync, class Counters>
MOK_HD bool wait_schedule_filled(Sync& s, const Counters& c, int32_t schedule_warps, int32_t rank) {
  return wait_at_least(s, c.abort_view(), c.schedule_filled, static_cast<uint32_t>(schedule_warps), CounterId::kScheduleFilled,
                       rank, rank, 0);
}

// A routing entry that names no expert, or one the token already named
// (kBadRouting, observed = the id), or whose weight is NaN or infinite
// (kBadWeight, observed = the weight's bits): recorded like a stall (first
// report wins) and the pass aborts, so that no (token, slot) is ever silently
// dropped or poisons its token's output.
MOK_EXEC_CHECK_DISABLE
template <class Sync, class Counters>
MOK_HD void report_bad_entry(Sync& s, const Counters& c, CounterId why, int32_t rank, int32_t entry,
                             uint32_t observed) {
  record_stall(s, c.abort_view(), why, rank, rank, entry, 0u, observed);
}

// A pass over a given schedule (schedule_given) whose buffers must hold all
// of it (needs_whole_schedule) finds it longer than they are -- a schedule
// from a forward of another layer or other token counts: recorded like a
// stall (observed = its padded rows, target = the rows the buffers hold) and
// the pass aborts before any row moves.
MOK_EXEC_CHECK_DISABLE
template <class Sync, class Pass>
MOK_HD bool require_schedule_fits(Sync& s, const PassCounters<Pass>& c, const PassGeometry<Pass>& g, int32_t rank) {
  if (buffers_hold_schedule(g)) return true;
  record_stall(s, c.abort_view(), CounterId::kScheduleOverflow, rank, rank, 0,
               static_cast<uint32_t>(g.ring_slots) * static_cast<uint32_t>(g.minibatch_rows),
               static_cast<uint32_t>(g.padded_rows));
  return false;
}

// ---- GEMM task tickets ------------------------------------------------------
MOK_EXEC_CHECK_DISABLE
template <class Sync, class Counters>
MOK_HD int64_t take_ticket(Sync& s, const Counters& c) {
  return static_cast<int64_t>(s.fetch_add_relaxed(c.ticket, 1u));
}

}  // namespace mok::protocol
