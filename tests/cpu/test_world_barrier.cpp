// The CPU model of device-ordered passes (src/protocol/world_barrier.hpp):
// R ranks, each driven by its own "host" thread that runs many passes in a
// row with no host-side ordering between ranks and no host zeroing of
// counters. Per pass a host stages its rank's inputs (tagged with the pass),
// then "launches its kernel": worker threads that run the start barrier,
// read every peer's staged inputs, take tickets, push tagged pieces into
// the home ranks' combine rows, wait for every owner's down_done, check the
// pieces, and end with the end barrier (the last worker zeroes the rank's
// other counter set). Random delays everywhere. The checks: every input read
// is of the current pass, every ticket is taken exactly once per pass, every
// piece a home rank combines is of the current pass, a stalled pass's report
// is still there when each host looks, the next passes are clean, and a rank
// that never starts a pass ends in a barrier report, not a hang. Two planted
// bugs (no start barrier, no zeroing) must be caught.
//
// Each counter set also holds a word past the counters, as the backward's
// sets hold its combine's cursor (FusedBackwardParams::kCounterSetTailWords):
// the home rank's workers take its tokens from it, and every token must be
// combined exactly once per pass. A third planted bug -- the end barrier
// clearing the counters but not that word -- must be caught too.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "protocol/pass_forward.hpp"
#include "protocol/host_sync.hpp"
#include "protocol/world_barrier.hpp"

namespace {

using namespace mok::protocol;
using std::chrono::milliseconds;

constexpr int kTokens = 6;  // staged inputs per rank
constexpr int kTasks = 10;  // tickets per rank per pass
constexpr size_t kTailWords = 1;  // past each set's counters: the combine's cursor
constexpr int64_t kEmpty = -1;

int64_t tag(uint32_t epoch, int rank, int item) {
  return (static_cast<int64_t>(epoch) << 40) | (static_cast<int64_t>(rank) << 20) | item;
}

struct BarrierModelOptions {
  int world = 3;
  int workers = 4;      // per rank: "warps"
  int passes = 12;
  int max_delay_us = 200;
  int stall_pass = -1;  // in this pass, rank stall_rank's worker 0 waits for what never comes
  int stall_rank = 1;
  int absent_rank = -1;  // this rank's host stops before absent_pass
  int absent_pass = 0;
  int slow_host_rank = -1;  // this host sleeps 20 ms before staging each pass
  bool skip_start_wait = false;  // planted bug: workers do not wait for the start barrier
  bool skip_zeroing = false;     // planted bug: the idle counter set is not zeroed
  bool skip_tail = false;        // planted bug: its counters are zeroed, the cursor past them is not
  milliseconds protocol_timeout{10000};
  milliseconds barrier_timeout{10000};
};

struct RankState {
  WorldBarrierWords barrier{};
  std::vector<uint32_t> sets[2];
  std::unique_ptr<std::atomic<int64_t>[]> staged;   // [kTokens], read by every peer
  std::unique_ptr<std::atomic<int64_t>[]> combine;  // [world * kTasks], written by owners
  std::unique_ptr<std::atomic<int>[]> claims;       // [kTasks] this pass (host bookkeeping)
  std::unique_ptr<std::atomic<int>[]> combined;     // [kTokens] this pass (host bookkeeping)
};

class BarrierModel {
 public:
  explicit BarrierModel(const BarrierModelOptions& o)
      : o_(o), protocol_sync_(o.protocol_timeout), barrier_sync_(o.barrier_timeout), ranks_(static_cast<size_t>(o.world)) {
    geometry_ = {};
    geometry_.tile_m = 4;
    geometry_.minibatch_rows = 8;
    geometry_.ring_slots = 2;
    geometry_.token_m_tiles = 2;
    for (RankState& r : ranks_) {
      r.sets[0].assign(counter_words(geometry_) + kTailWords, 0u);
      r.sets[1].assign(counter_words(geometry_) + kTailWords, 0u);
      r.staged = std::make_unique<std::atomic<int64_t>[]>(kTokens);
      r.combine = std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(o.world) * kTasks);
      r.claims = std::make_unique<std::atomic<int>[]>(kTasks);
      r.combined = std::make_unique<std::atomic<int>[]>(kTokens);
      for (int i = 0; i < kTokens; ++i) r.combined[i] = 0;
      for (int i = 0; i < kTokens; ++i) r.staged[i] = kEmpty;
      for (int i = 0; i < o.world * kTasks; ++i) r.combine[i] = kEmpty;
      for (int i = 0; i < kTasks; ++i) r.claims[i] = 0;
    }
    host_saw_abort_.assign(static_cast<size_t>(o.world), std::vector<int>(static_cast<size_t>(o.passes + 1), 0));
  }

  void run() {
    std::vector<std::thread> hosts;
    for (int r = 0; r < o_.world; ++r) hosts.emplace_back([this, r] { host(r); });
    for (std::thread& t : hosts) t.join();
  }

  std::vector<std::string> errors() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return errors_;
  }
  // What rank r's host read as the abort flag of pass e after its kernel.
  bool host_saw_abort(int r, int e) const { return host_saw_abort_[r][e] != 0; }
  const WorldBarrierWords& barrier(int r) const { return ranks_[r].barrier; }
  const StallReport& pass_report(int e) const {
    return *carve_counters(geometry_, const_cast<uint32_t*>(ranks_[0].sets[counter_set_of(e)].data())).stall;
  }

 private:
  void fail(const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (errors_.size() < 20) errors_.push_back(message);
  }
  void delay(std::mt19937& rng) {
    if (o_.max_delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % o_.max_delay_us));
  }
  // Rank r's counters of pass e, with the world's abort flag and report in rank 0's set.
  ForwardCounters counters(int r, uint32_t e) {
    const int set = counter_set_of(e);
    const ForwardCounters rank0 = carve_counters(geometry_, ranks_[0].sets[set].data());
    return carve_counters(geometry_, ranks_[r].sets[set].data(), rank0.abort, rank0.stall);
  }
  WorldBarrierWords* words(int q) { return &ranks_[q].barrier; }

  void host(int r) {
    std::mt19937 rng(static_cast<unsigned>(77 + r));
    for (uint32_t e = 1; e <= static_cast<uint32_t>(o_.passes); ++e) {
      if (r == o_.absent_rank && static_cast<int>(e) >= o_.absent_pass) return;
      if (r == o_.slow_host_rank) std::this_thread::sleep_for(milliseconds(20));
      // The staging copy, enqueued before the kernel on the rank's stream.
      for (int i = 0; i < kTokens; ++i) {
        ranks_[r].staged[i].store(tag(e, r, i), std::memory_order_relaxed);
        delay(rng);
      }
      std::vector<std::thread> workers;
      for (int w = 0; w < o_.workers; ++w) workers.emplace_back([this, r, w, e] { worker(r, w, e); });
      for (std::thread& t : workers) t.join();  // the kernel ends
      // What the host reads after the kernel: the pass's abort flag (rank 0's set).
      const ForwardCounters c = counters(r, e);
      host_saw_abort_[r][e] = HostSync::load_acquire(c.abort) != 0 ? 1 : 0;
      if (HostSync::load_acquire(&ranks_[r].barrier.broken) != 0) return;  // the world is broken
      if (!host_saw_abort_[r][e]) {
        for (int t = 0; t < kTasks; ++t) {
          if (ranks_[r].claims[t] != 1) {
            fail("rank " + std::to_string(r) + " pass " + std::to_string(e) + ": ticket " + std::to_string(t) +
                 " taken " + std::to_string(ranks_[r].claims[t].load()) + " times");
          }
        }
      }
      if (!host_saw_abort_[r][e]) {
        for (int t = 0; t < kTokens; ++t) {
          if (ranks_[r].combined[t] != 1) {
            fail("rank " + std::to_string(r) + " pass " + std::to_string(e) + ": token " + std::to_string(t) +
                 " combined " + std::to_string(ranks_[r].combined[t].load()) + " times");
          }
        }
      }
      for (int t = 0; t < kTasks; ++t) ranks_[r].claims[t] = 0;
      for (int t = 0; t < kTokens; ++t) ranks_[r].combined[t] = 0;
      delay(rng);
    }
  }

  void worker(int r, int w, uint32_t e) {
    std::mt19937 rng(static_cast<unsigned>(e * 1000 + r * 10 + w));
    RankState& me = ranks_[r];
    delay(rng);
    bool started = true;
    auto peer_words = [this](int32_t q) { return words(q); };
    if (o_.skip_start_wait) {  // the planted bug: announce, never wait
      if (w == 0) signal_world_started(barrier_sync_, peer_words, o_.world, r, e);
    } else {
      started = start_world_pass(barrier_sync_, peer_words, me.barrier, w == 0, o_.world, r, e);
    }
    if (started) work(r, w, e, rng);
    finish(r, e);
  }

  void work(int r, int w, uint32_t e, std::mt19937& rng) {
    RankState& me = ranks_[r];
    const ForwardCounters c = counters(r, e);
    // The schedule and the dispatch read every peer's staged inputs.
    for (int q = 0; q < o_.world; ++q) {
      for (int i = w; i < kTokens; i += o_.workers) {
        const int64_t seen = ranks_[q].staged[i].load(std::memory_order_relaxed);
        if (seen != tag(e, q, i)) {
          fail("rank " + std::to_string(r) + " pass " + std::to_string(e) + " read rank " + std::to_string(q) +
               "'s input " + std::to_string(i) + " of another pass");
        }
      }
      delay(rng);
    }
    if (static_cast<int>(e) == o_.stall_pass && r == o_.stall_rank && w == 0) {
      wait_at_least(protocol_sync_, c.abort_view(), c.counter[ForwardPass::kDownDone], kTasks + 1, CounterId::kDownDone, r, r, 0);  // never comes
      return;
    }
    // GEMM tasks: each pushes a piece into its home rank's combine row.
    for (;;) {
      if (HostSync::load_relaxed(c.abort) != 0) return;
      const int64_t t = take_ticket(protocol_sync_, c);
      if (t >= kTasks) break;
      me.claims[t].fetch_add(1);
      const int home = static_cast<int>(t % o_.world);
      ranks_[home].combine[r * kTasks + t].store(tag(e, r, static_cast<int>(t)), std::memory_order_relaxed);
      delay(rng);
      HostSync::add_release(c.counter[ForwardPass::kDownDone], 1u);  // the down task's signal
    }
    // The combine: every worker of the home rank takes tokens from the
    // cursor past its set's counters (the backward's combine_next).
    uint32_t* const cursor = me.sets[counter_set_of(e)].data() + counter_words(geometry_);
    for (;;) {
      if (HostSync::load_relaxed(c.abort) != 0) return;
      const uint32_t token = HostSync::fetch_add_acq_rel(cursor, 1u);
      if (token >= static_cast<uint32_t>(kTokens)) break;
      me.combined[token].fetch_add(1);
      delay(rng);
    }
    // Worker 0 of the home rank: every owner done, then its pieces.
    if (w != 0) return;
    for (int q = 0; q < o_.world; ++q) {
      const ForwardCounters owner = counters(q, e);
      if (!wait_at_least(protocol_sync_, c.abort_view(), owner.counter[ForwardPass::kDownDone], kTasks, CounterId::kDownDone, r, q, 0)) return;
      const uint32_t seen = HostSync::load_acquire(owner.counter[ForwardPass::kDownDone]);
      if (seen != kTasks) {
        fail("rank " + std::to_string(r) + " pass " + std::to_string(e) + ": rank " + std::to_string(q) +
             "'s down_done is " + std::to_string(seen) + ", more than its " + std::to_string(kTasks) +
             " tasks (a counter set was not zeroed)");
      }
      for (int t = r; t < kTasks; t += o_.world) {
        if (me.combine[q * kTasks + t].load(std::memory_order_relaxed) != tag(e, q, t)) {
          fail("rank " + std::to_string(r) + " pass " + std::to_string(e) + ": piece " + std::to_string(t) +
               " of rank " + std::to_string(q) + " is not of this pass");
        }
      }
    }
  }

  void finish(int r, uint32_t e) {
    RankState& me = ranks_[r];
    if (!arrive_pass_done(barrier_sync_, me.barrier, static_cast<uint32_t>(o_.workers))) return;
    if (!finish_world_pass(barrier_sync_, [this](int32_t q) { return words(q); }, me.barrier, o_.world, r, e)) return;
    if (o_.skip_zeroing) return;
    std::vector<uint32_t>& idle = me.sets[1 - counter_set_of(e)];
    // The counters and the words past them, as world_finish clears them.
    const size_t words = o_.skip_tail ? counter_words(geometry_) : idle.size();
    clear_counter_set(barrier_sync_, idle.data(), words, 0u, 1u);
  }

  BarrierModelOptions o_;
  HostSync protocol_sync_;
  HostSync barrier_sync_;
  ForwardGeometry geometry_{};
  std::vector<RankState> ranks_;
  std::vector<std::vector<int>> host_saw_abort_;
  mutable std::mutex mutex_;
  std::vector<std::string> errors_;
};

TEST(WorldBarrier, ManyPassesWithoutHostZeroingUnderRandomDelays) {
  for (int world : {1, 2, 3, 4}) {
    for (int max_delay_us : {0, 50, 300}) {
      SCOPED_TRACE(testing::Message() << "world=" << world << " max_delay_us=" << max_delay_us);
      BarrierModelOptions o;
      o.world = world;
      o.max_delay_us = max_delay_us;
      o.passes = max_delay_us > 100 ? 8 : 20;
      o.slow_host_rank = world > 1 && max_delay_us == 50 ? world - 1 : -1;
      BarrierModel model(o);
      model.run();
      for (const std::string& e : model.errors()) ADD_FAILURE() << e;
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(model.barrier(r).broken, 0u) << "rank " << r;
        for (int e = 1; e <= o.passes; ++e) EXPECT_FALSE(model.host_saw_abort(r, e)) << "rank " << r << " pass " << e;
      }
    }
  }
}

TEST(WorldBarrier, AStalledPassIsReportedToEveryHostAndTheNextPassesAreClean) {
  BarrierModelOptions o;
  o.world = 3;
  o.passes = 7;
  o.stall_pass = 3;
  o.stall_rank = 1;
  o.max_delay_us = 100;
  o.protocol_timeout = milliseconds(200);
  BarrierModel model(o);
  model.run();
  for (const std::string& e : model.errors()) ADD_FAILURE() << e;
  for (int r = 0; r < o.world; ++r) {
    EXPECT_EQ(model.barrier(r).broken, 0u) << "rank " << r;  // a stalled pass is not a broken world
    for (int e = 1; e <= o.passes; ++e) {
      EXPECT_EQ(model.host_saw_abort(r, e), e == o.stall_pass) << "rank " << r << " pass " << e;
    }
  }
  // Pass 3's report was in rank 0's set 1, zeroed at the end of pass 4 and
  // used again (cleanly) by passes 5 and 7: nothing stale remains.
  EXPECT_EQ(model.pass_report(7).counter, 0u);
}

TEST(WorldBarrier, ARankThatNeverStartsAPassEndsInABarrierReportNotAHang) {
  BarrierModelOptions o;
  o.world = 3;
  o.passes = 5;
  o.absent_rank = 2;
  o.absent_pass = 3;  // rank 2 runs passes 1 and 2 only
  o.barrier_timeout = milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  BarrierModel model(o);
  model.run();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  for (const std::string& e : model.errors()) ADD_FAILURE() << e;
  for (int r = 0; r < 2; ++r) {
    const WorldBarrierWords& b = model.barrier(r);
    ASSERT_NE(b.broken, 0u) << "rank " << r;
    EXPECT_EQ(b.stall.counter, static_cast<uint32_t>(CounterId::kWorldStarted));
    EXPECT_EQ(b.stall.waiter, r);
    EXPECT_EQ(b.stall.owner, 2);
    EXPECT_EQ(b.stall.target, 3u);
    EXPECT_EQ(b.stall.observed, 2u);
  }
}

// What the checks report on a model with a planted bug (which they must catch).
std::vector<std::string> errors_with(const BarrierModelOptions& o) {
  BarrierModel model(o);
  model.run();
  return model.errors();
}

// Two ranks, four passes, short delays: a set serves twice.
BarrierModelOptions two_ranks_four_passes() {
  BarrierModelOptions o;
  o.world = 2;
  o.passes = 4;
  o.max_delay_us = 20;
  return o;
}

TEST(WorldBarrier, TheChecksCatchAWorkerThatSkipsTheStartBarrier) {
  BarrierModelOptions o;
  o.world = 3;
  o.passes = 4;
  o.slow_host_rank = 2;  // its inputs are staged late: early readers see another pass's
  o.skip_start_wait = true;
  o.protocol_timeout = milliseconds(2000);
  EXPECT_FALSE(errors_with(o).empty());
}

TEST(WorldBarrier, TheChecksCatchAnIdleCounterSetThatIsNotZeroed) {
  BarrierModelOptions o = two_ranks_four_passes();
  o.skip_zeroing = true;
  o.protocol_timeout = milliseconds(300);
  EXPECT_FALSE(errors_with(o).empty());
}

TEST(WorldBarrier, TheChecksCatchACursorPastTheCountersThatIsNotZeroed) {
  BarrierModelOptions o = two_ranks_four_passes();
  o.skip_tail = true;
  const std::vector<std::string> errors = errors_with(o);
  ASSERT_FALSE(errors.empty());
  // Caught where it bites: a set's next pass finds its cursor past the tokens.
  EXPECT_NE(errors.front().find("combined 0 times"), std::string::npos) << errors.front();
}

}  // namespace

// ---- the barrier's own rules, one rank at a time ---------------------------

namespace {

TEST(WorldBarrierRules, ABrokenRankAnnouncesNoPassAndPassesNoBarrier) {
  HostSync sync(milliseconds(50));
  WorldBarrierWords words[2]{};
  auto peer_words = [&](int32_t q) { return &words[q]; };
  words[0].broken = 1;
  words[0].published[1] = 3;  // the peer is there: still no pass for a broken rank
  words[0].published[0] = 2;
  EXPECT_FALSE(start_world_pass(sync, peer_words, words[0], true, 2, 0, 3));
  EXPECT_EQ(words[1].published[0], 0u) << "a broken rank announced a start";
  EXPECT_FALSE(finish_world_pass(sync, peer_words, words[0], 2, 0, 3));
  EXPECT_EQ(words[1].finished[0], 0u) << "a broken rank announced an end";
}

TEST(WorldBarrierRules, AWordAboveTheAwaitedPassBreaksTheWorldAtOnce) {
  HostSync sync(milliseconds(5000));
  WorldBarrierWords words[2]{};
  auto peer_words = [&](int32_t q) { return &words[q]; };
  words[0].published[1] = 5;  // rank 1 is at pass 5 while rank 0 starts pass 3: out of step
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(start_world_pass(sync, peer_words, words[0], true, 2, 0, 3));
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000)) << "waited for a timeout";
  EXPECT_NE(words[0].broken, 0u);
  EXPECT_EQ(words[0].stall.counter, static_cast<uint32_t>(CounterId::kWorldStarted));
  EXPECT_EQ(words[0].stall.owner, 1);
  EXPECT_EQ(words[0].stall.target, 3u);
  EXPECT_EQ(words[0].stall.observed, 5u);

  WorldBarrierWords fresh[2]{};
  auto fresh_words = [&](int32_t q) { return &fresh[q]; };
  fresh[0].finished[1] = 4;
  EXPECT_FALSE(finish_world_pass(sync, fresh_words, fresh[0], 2, 0, 3));
  EXPECT_EQ(fresh[0].stall.counter, static_cast<uint32_t>(CounterId::kWorldFinished));
  EXPECT_EQ(fresh[0].stall.observed, 4u);
}

TEST(WorldBarrierRules, InStepRanksPassBothBarriers) {
  HostSync sync(milliseconds(5000));
  WorldBarrierWords words[2]{};
  auto peer_words = [&](int32_t q) { return &words[q]; };
  words[0].published[1] = 3;
  words[0].finished[1] = 3;
  EXPECT_TRUE(start_world_pass(sync, peer_words, words[0], true, 2, 0, 3));
  EXPECT_EQ(words[1].published[0], 3u);
  EXPECT_TRUE(finish_world_pass(sync, peer_words, words[0], 2, 0, 3));
  EXPECT_EQ(words[1].finished[0], 3u);
  EXPECT_EQ(words[0].broken, 0u);
}

}  // namespace
