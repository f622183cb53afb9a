// The world barrier of device-ordered passes: how the ranks of a world order
// consecutive passes among themselves when no host can order them (one
// process per GPU), and so that no host has to zero counters between passes.
// docs/protocol.md ("Device-ordered passes") gives the argument; this file and
// that section change together. Same Sync backends as counters.hpp (the CPU
// model in tests/cpu/test_world_barrier.cpp runs these very functions).
//
// Pass `epoch` (1, 2, 3, ... per world object; the host passes it in):
//   start  one thread of rank r stores epoch into published[r] of every rank,
//          then every CTA of r waits until r's own published[q] >= epoch for
//          all q. Only then may r read a peer's inputs or counters.
//   work   counters of set epoch % 2 (two sets per rank, see below).
//   end    each worker (warp) of r arrives on r's workers_done; the last one
//          stores epoch into finished[r] of every rank, waits until r's own
//          finished[q] >= epoch for all q, and zeroes r's *other* counter set,
//          the one pass epoch + 1 uses.
//
// Why two counter sets: the pass's abort flag and stall report live in a set
// (rank 0's), and every host reads them after its kernel ends; zeroing the set
// of the pass that just ended would erase them before a slower host looks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/host_device.hpp"
#include "mok/layer_config.hpp"
#include "protocol/counters.hpp"

namespace mok::protocol {

// One rank's barrier words, in that rank's memory. Zeroed once when the
// workspace is made and never again: epochs only grow, so each wait compares
// against the current epoch (2^32 passes before a wrap).
struct WorldBarrierWords {
  uint32_t published[kMaxWorldSize];  // [q]: the last pass rank q started (stored by q)
  uint32_t finished[kMaxWorldSize];   // [q]: the last pass rank q finished (stored by q)
  uint32_t workers_done;              // workers of this rank done with the current pass; the last resets it
  uint32_t broken;                    // nonzero once a barrier wait of this rank gave up: the world is unusable
  StallReport stall;                  // that wait's report
};

// The counter set that pass `epoch` uses.
MOK_HD int counter_set_of(uint32_t epoch) { return static_cast<int>(epoch % 2u); }

// The abort flag and report of barrier waits: the rank's own `broken`, not the
// pass's abort flag. A barrier wait must not give up because the *pass*
// aborted -- the end barrier is what makes an aborted pass safe to follow --
// only because the barrier itself timed out.
MOK_HD AbortView barrier_view(WorldBarrierWords& mine) { return AbortView{&mine.broken, &mine.stall}; }

// Both barriers are one word per rank in every rank's memory, raised to the
// pass's epoch: `published` at the start of a pass, `finished` at its end.
using BarrierWord = uint32_t (WorldBarrierWords::*)[kMaxWorldSize];

// Stores (release) `epoch` into word[me] of every rank. `words(q)` is rank
// q's WorldBarrierWords* as `me` sees it.
MOK_EXEC_CHECK_DISABLE
template <class Sync, class Words>
MOK_HD void raise_world_word(Sync& s, Words words, BarrierWord word, int32_t world_size, int32_t me, uint32_t epoch) {
  for (int32_t q = 0; q < world_size; ++q) s.store_release(&(words(q)->*word)[me], epoch);
}
// Polls only `me`'s own memory until every rank raised its word to `epoch`.
// While `me` waits for pass `epoch`, no peer can be past it (a peer leaves a
// barrier only once `me` got there too), so a word above `epoch` means the
// ranks are out of step (a host that ran on after its world broke, or a launch
// that failed on one rank): that breaks the world too, instead of letting the
// wait pass against counter sets of another pass.
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD bool wait_world_word(Sync& s, WorldBarrierWords& mine, BarrierWord word, CounterId id, int32_t world_size,
                            int32_t me, uint32_t epoch) {
  const AbortView view = barrier_view(mine);
  for (int32_t q = 0; q < world_size; ++q) {
    if (!wait_at_least(s, view, &(mine.*word)[q], epoch, id, me, q, q)) return false;
    const uint32_t seen = s.load_acquire(&(mine.*word)[q]);
    if (seen != epoch) {
      record_stall(s, view, id, me, q, q, epoch, seen);
      return false;
    }
  }
  return true;
}

// ---- start of a pass --------------------------------------------------------
// One thread of rank `me`, before any of its roles runs, and after everything
// its host enqueued before the pass (staging copies of its inputs).
MOK_EXEC_CHECK_DISABLE
template <class Sync, class Words>
MOK_HD void signal_world_started(Sync& s, Words words, int32_t world_size, int32_t me, uint32_t epoch) {
  raise_world_word(s, words, &WorldBarrierWords::published, world_size, me, epoch);
}
// Every CTA of `me` (one thread each): every rank has started this pass, so
// every rank finished the previous one (its host launched this pass after it)
// and published this pass's inputs.
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD bool wait_world_started(Sync& s, WorldBarrierWords& mine, int32_t world_size, int32_t me, uint32_t epoch) {
  return wait_world_word(s, mine, &WorldBarrierWords::published, CounterId::kWorldStarted, world_size, me, epoch);
}

// The start of a pass for one thread of every CTA of `me` (`signal`: the one
// that announces it). A rank whose world broke never announces a pass again:
// its peers then time out and report it, rather than pass their barrier and
// run against counter sets this rank no longer clears.
MOK_EXEC_CHECK_DISABLE
template <class Sync, class Words>
MOK_HD bool start_world_pass(Sync& s, Words words, WorldBarrierWords& mine, bool signal, int32_t world_size,
                             int32_t me, uint32_t epoch) {
  if (s.load_acquire(&mine.broken) != 0) return false;
  if (signal) signal_world_started(s, words, world_size, me, epoch);
  return wait_world_started(s, mine, world_size, me, epoch);
}

// ---- end of a pass ----------------------------------------------------------
// Every worker of the rank once it has nothing left to do in the pass
// (finished or aborted), after its last access to any rank's memory. The
// acq_rel add releases the worker's accesses and lets the last one acquire
// them all. Returns true for exactly one worker, the last; it resets the count
// (no other worker of this pass arrives any more, and the next pass of this
// rank is a later kernel on the same stream).
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD bool arrive_pass_done(Sync& s, WorldBarrierWords& mine, uint32_t workers) {
  if (s.fetch_add_acq_rel(&mine.workers_done, 1u) + 1u != workers) return false;
  s.store_relaxed(&mine.workers_done, 0u);
  return true;
}
// The last worker: every access of this rank in this pass is done.
MOK_EXEC_CHECK_DISABLE
template <class Sync, class Words>
MOK_HD void signal_world_finished(Sync& s, Words words, int32_t world_size, int32_t me, uint32_t epoch) {
  raise_world_word(s, words, &WorldBarrierWords::finished, world_size, me, epoch);
}
// The last worker, then: once every rank finished the pass, nobody touches
// this rank's memory until every rank started the next pass.
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD bool wait_world_finished(Sync& s, WorldBarrierWords& mine, int32_t world_size, int32_t me, uint32_t epoch) {
  return wait_world_word(s, mine, &WorldBarrierWords::finished, CounterId::kWorldFinished, world_size, me, epoch);
}
// The last worker's end of the pass: announce it, then wait for every rank.
// A broken rank announces nothing (see start_world_pass).
MOK_EXEC_CHECK_DISABLE
template <class Sync, class Words>
MOK_HD bool finish_world_pass(Sync& s, Words words, WorldBarrierWords& mine, int32_t world_size, int32_t me,
                              uint32_t epoch) {
  if (s.load_acquire(&mine.broken) != 0) return false;
  signal_world_finished(s, words, world_size, me, epoch);
  return wait_world_finished(s, mine, world_size, me, epoch);
}
// After wait_world_finished: the rank's other counter set (`count` words, the
// next pass's) back to zero, lanes `lane`, `lane + lanes`, ... Relaxed
// stores suffice: the next pass of this rank is a later kernel on the same
// stream, and a peer reads the set only after that kernel's start signal.
MOK_EXEC_CHECK_DISABLE
template <class Sync>
MOK_HD void clear_counter_set(Sync& s, uint32_t* words, size_t count, uint32_t lane, uint32_t lanes) {
  for (size_t i = lane; i < count; i += lanes) s.store_relaxed(words + i, 0u);
}

}  // namespace mok::protocol
