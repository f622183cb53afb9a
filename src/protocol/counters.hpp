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
#include <cstdint>

#include "common/host_device.hpp"
#include "protocol/forward_plan.hpp"

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

// One rank's counters. All live in that rank's memory and start at zero.
struct ForwardCounters {
  uint32_t* tile_filled;     // [ring_tiles]
  uint32_t* ring_consumed;   // [ring_slots]
  uint32_t* h_ready;         // [ring_tiles]
  uint32_t* h_consumed;      // [ring_slots]
  uint32_t* shared_h_ready;  // [shared_m_tiles]
  uint32_t* shared_done;     // [1]
  uint32_t* down_done;       // [1]
  uint32_t* ticket;          // [1] next GEMM task
  uint32_t* schedule_counted;  // [1] schedule warps whose chunk is counted
  uint32_t* schedule_scanned;  // [1] local experts whose chunk offsets and total are known
  uint32_t* schedule_filled;   // [1] schedule warps whose chunk's rows are written
  uint32_t* abort;           // [1] nonzero once any wait of the world gave up
  StallReport* stall;        // [1]
};

// Words of uint32_t the counters take; the caller zeroes them before a pass.
MOK_HD size_t counter_words(const ForwardGeometry& g) {
  return 2 * static_cast<size_t>(g.ring_tiles()) + 2 * static_cast<size_t>(g.ring_slots) +
         static_cast<size_t>(g.shared_m_tiles) + 7 + sizeof(StallReport) / sizeof(uint32_t);
}

// Carves the counters out of `words` (counter_words(g) zeroed words). The
// stall report and abort flag given here are the world's shared ones when
// not null, so that one stall stops every rank.
MOK_HD ForwardCounters carve_counters(const ForwardGeometry& g, uint32_t* words,
                                      uint32_t* world_abort = nullptr,
                                      StallReport* world_stall = nullptr) {
  ForwardCounters c;
  c.tile_filled = words;
  words += g.ring_tiles();
  c.ring_consumed = words;
  words += g.ring_slots;
  c.h_ready = words;
  words += g.ring_tiles();
  c.h_consumed = words;
  words += g.ring_slots;
  c.shared_h_ready = words;
  words += g.shared_m_tiles;
  c.shared_done = words++;
  c.down_done = words++;
  c.ticket = words++;
  c.schedule_counted = words++;
  c.schedule_scanned = words++;
  c.schedule_filled = words++;
  c.abort = world_abort != nullptr ? world_abort : words;
  ++words;
  c.stall = world_stall != nullptr ? world_stall : reinterpret_cast<StallReport*>(words);
  return c;
}

// Records a failed wait in the stall report (the first one wins) and raises
// the abort flag.
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD void record_stall(Sync& sync, const ForwardCounters& waiter_view, CounterId id, int32_t waiter, int32_t owner,
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

// Spins until *counter >= target. Returns false when the pass is aborting:
// another wait timed out, or this one did (then it records the stall first).
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD bool wait_at_least(Sync& sync, const ForwardCounters& waiter_view, const uint32_t* counter,
                          uint32_t target, CounterId id, int32_t waiter, int32_t owner,
                          int32_t index) {
  auto clock = sync.start_clock();
  for (;;) {
    const uint32_t observed = sync.load_acquire(counter);
    if (observed >= target) return true;
    if (sync.load_relaxed(waiter_view.abort) != 0) return false;
    if (sync.expired(clock)) {
      record_stall(sync, waiter_view, id, waiter, owner, index, target, observed);
      return false;
    }
    sync.pause();
  }
}

// ---- dispatch ---------------------------------------------------------------
// Before filling m-tile rows of minibatch mb: its ring slot's previous
// generation must have been read by every gate/up task.
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD bool wait_ring_free(Sync& s, const ForwardCounters& c, const ForwardGeometry& g, int32_t mb, int32_t rank) {
  const int32_t slot = g.slot_of(mb);
  return wait_at_least(s, c, c.ring_consumed + slot, ring_free_target(g, mb), CounterId::kRingConsumed, rank, rank, slot);
}
// After the m-tile's rows are in the ring (the copies complete and visible).
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD void signal_tile_filled(Sync& s, const ForwardCounters& c, const ForwardGeometry& g, int32_t m_tile) {
  const int32_t mb = m_tile / g.tiles_per_minibatch();
  s.store_release(c.tile_filled + ring_tile_index(g, m_tile), tile_filled_target(g, mb));
}

// ---- routed gate/up (+SwiGLU) -----------------------------------------------
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD bool wait_tile_filled(Sync& s, const ForwardCounters& c, const ForwardGeometry& g, int32_t m_tile, int32_t rank) {
  const int32_t mb = m_tile / g.tiles_per_minibatch();
  const int32_t index = ring_tile_index(g, m_tile);
  return wait_at_least(s, c, c.tile_filled + index, tile_filled_target(g, mb), CounterId::kTileFilled, rank, rank, index);
}
// Before writing h of minibatch mb: its h slot's previous generation was read
// by every down task.
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD bool wait_h_free(Sync& s, const ForwardCounters& c, const ForwardGeometry& g, int32_t mb, int32_t rank) {
  const int32_t slot = g.slot_of(mb);
  return wait_at_least(s, c, c.h_consumed + slot, h_free_target(g, mb), CounterId::kHConsumed, rank, rank, slot);
}
// After the task's last read of the x ring.
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD void signal_ring_consumed(Sync& s, const ForwardCounters& c, const ForwardGeometry& g, int32_t mb) {
  s.add_release(c.ring_consumed + g.slot_of(mb), 1u);
}
// After the task's h columns are stored and visible.
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD void signal_h_ready(Sync& s, const ForwardCounters& c, const ForwardGeometry& g, int32_t m_tile) {
  s.add_release(c.h_ready + ring_tile_index(g, m_tile), 1u);
}

// ---- routed down ------------------------------------------------------------
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD bool wait_h_ready(Sync& s, const ForwardCounters& c, const ForwardGeometry& g, int32_t m_tile, int32_t rank) {
  const int32_t mb = m_tile / g.tiles_per_minibatch();
  const int32_t index = ring_tile_index(g, m_tile);
  return wait_at_least(s, c, c.h_ready + index, h_ready_target(g, mb), CounterId::kHReady, rank, rank, index);
}
// After the task's last read of the h ring.
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD void signal_h_consumed(Sync& s, const ForwardCounters& c, const ForwardGeometry& g, int32_t mb) {
  s.add_release(c.h_consumed + g.slot_of(mb), 1u);
}
// After the task's y rows are stored into their home ranks' combine buffers.
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD void signal_down_done(Sync& s, const ForwardCounters& c) {
  s.add_release(c.down_done, 1u);
}

// ---- shared expert ----------------------------------------------------------
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD void signal_shared_h_ready(Sync& s, const ForwardCounters& c, int32_t m_tile) {
  s.add_release(c.shared_h_ready + m_tile, 1u);
}
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD bool wait_shared_h_ready(Sync& s, const ForwardCounters& c, const ForwardGeometry& g, int32_t m_tile, int32_t rank) {
  return wait_at_least(s, c, c.shared_h_ready + m_tile, shared_h_ready_target(g), CounterId::kSharedHReady, rank, rank, m_tile);
}
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD void signal_shared_done(Sync& s, const ForwardCounters& c) {
  s.add_release(c.shared_done, 1u);
}

// ---- combine (on the home rank) ---------------------------------------------
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD bool wait_shared_done(Sync& s, const ForwardCounters& c, const ForwardGeometry& g, int32_t rank) {
  return wait_at_least(s, c, c.shared_done, shared_done_target(g), CounterId::kSharedDone, rank, rank, 0);
}
// Polls the owner's own counter (a read of peer memory; no remote atomics):
// once it reaches the owner's total, every y row the owner made is in place.
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD bool wait_down_done(Sync& s, const ForwardCounters& waiter, const ForwardCounters& owner_counters,
                           const ForwardGeometry& owner_geometry, int32_t waiter_rank, int32_t owner_rank) {
  return wait_at_least(s, waiter, owner_counters.down_done, down_done_target(owner_geometry),
                       CounterId::kDownDone, waiter_rank, owner_rank, 0);
}

// ---- the schedule (built inside the pass, per rank) -------------------------
// W schedule warps each count one chunk of the world's routing entries; then
// one warp per local expert scans its chunk counts; then every warp writes its
// chunk's rows (src/device/roles/schedule_role.cuh).
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD void signal_schedule_counted(Sync& s, const ForwardCounters& c) {
  s.add_release(c.schedule_counted, 1u);
}
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD bool wait_schedule_counted(Sync& s, const ForwardCounters& c, int32_t schedule_warps, int32_t rank) {
  return wait_at_least(s, c, c.schedule_counted, static_cast<uint32_t>(schedule_warps), CounterId::kScheduleCounted,
                       rank, rank, 0);
}
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD void signal_schedule_scanned(Sync& s, const ForwardCounters& c, uint32_t experts) {
  s.add_release(c.schedule_scanned, experts);
}
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD bool wait_schedule_scanned(Sync& s, const ForwardCounters& c, int32_t num_local, int32_t rank) {
  return wait_at_least(s, c, c.schedule_scanned, static_cast<uint32_t>(num_local), CounterId::kScheduleScanned,
                       rank, rank, 0);
}
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD void signal_schedule_filled(Sync& s, const ForwardCounters& c) {
  s.add_release(c.schedule_filled, 1u);
}
// Every reader of the schedule (dispatch, routed GEMM tasks, combines reading
// an owner's padded size) waits for this.
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD bool wait_schedule_filled(Sync& s, const ForwardCounters& c, int32_t schedule_warps, int32_t rank) {
  return wait_at_least(s, c, c.schedule_filled, static_cast<uint32_t>(schedule_warps), CounterId::kScheduleFilled,
                       rank, rank, 0);
}

// A routing entry that names no expert, or one the token already named:
// recorded like a stall (first report wins) and the pass aborts, so that no
// (token, slot) is ever silently dropped.
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD void report_bad_routing(Sync& s, const ForwardCounters& c, int32_t rank, int32_t entry, int32_t expert) {
  StallReport* report = c.stall;
  if (s.compare_exchange(&report->counter, 0u, static_cast<uint32_t>(CounterId::kBadRouting))) {
    report->waiter = rank;
    report->owner = rank;
    report->index = entry;
    report->target = 0;
    report->observed = static_cast<uint32_t>(expert);
  }
  s.store_release(c.abort, 1u);
}

// ---- GEMM task tickets ------------------------------------------------------
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD int64_t take_ticket(Sync& s, const ForwardCounters& c) {
  return static_cast<int64_t>(s.fetch_add_relaxed(c.ticket, 1u));
}

}  // namespace mok::protocol
