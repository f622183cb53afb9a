// The CPU model of the forward flow control: host threads stand in for the SM
// roles of every rank (dispatch workers, GEMM workers taking tickets, the
// combine), with random delays, and run the very functions of
// src/protocol/ (targets, task order, signal/wait). Data are tags, not
// numbers: each ring row must hold exactly the token the schedule says when a
// GEMM task reads it, every h and y row must be made from the right source,
// every (token, slot) result must land exactly once, and the pass must finish.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mok/synthetic.hpp"
#include "mok/presets.hpp"
#include "mok/schedule.hpp"
#include "protocol/counters.hpp"
#include "protocol/host_sync.hpp"

namespace {

using namespace mok::protocol;

constexpr int64_t kEmpty = -1;    // never written
constexpr int64_t kPadding = -2;  // a padding row's content

int64_t token_tag(int rank, int token) { return (static_cast<int64_t>(rank) << 32) | token; }
// What a task derived from a tag in column n writes: any injective mix will do.
int64_t derived(int64_t tag, int column, int64_t salt) { return tag * 1009 + column * 17 + salt; }

struct ModelOptions {
  int tile_m = 4;
  int minibatch_tiles = 2;
  int ring_slots = 2;
  int gate_up_n_tiles = 2;
  int down_n_tiles = 3;
  int shared_gate_up_n_tiles = 2;  // used only when the shape has a shared expert
  int shared_down_n_tiles = 2;
  int lookahead = 1;
  int dispatch_workers = 2;  // per rank; 0 starves the pass (timeout test)
  int gemm_workers = 3;      // per rank
  // Tickets a GEMM worker holds beyond the one it works on. A device GEMM CTA
  // holds up to 2 (the task posted and streaming, and the fetcher's next one)
  // while its consumers work on a third; the model holds more, the stronger
  // case.
  int tickets_ahead = 3;
  int dispatch_delay_us = 20;
  int gemm_delay_us = 20;
  bool dispatch_ignores_ring = false;  // a planted bug: the checks must catch it
  std::chrono::milliseconds timeout{10000};
};

struct RankModel {
  ForwardGeometry geometry{};
  std::vector<uint32_t> counter_words;
  ForwardCounters counters{};
  std::vector<int64_t> ring;      // [ring rows]: x tags
  std::vector<int64_t> h;         // [ring rows, gate_up_n_tiles]
  std::vector<int64_t> shared_h;  // [shared rows, shared_gate_up_n_tiles]
  std::vector<int64_t> shared_out;        // [T, shared_down_n_tiles]
  std::vector<int64_t> combine;           // [T, k, down_n_tiles]: y pieces, written by owners
  std::unique_ptr<std::atomic<int>[]> copies;  // per schedule row: times dispatched
};

class ProtocolModel {
 public:
  ProtocolModel(const mok::LayerConfig& config, const mok::synthetic::Layer& layer,
                const ModelOptions& options)
      : config_(config), options_(options), sync_(options.timeout) {
    const auto routing = layer.routing();
    schedule_ = mok::build_schedule(config, routing, {options.tile_m, 1});
    ranks_.resize(static_cast<size_t>(config.world_size));
    for (int r = 0; r < config.world_size; ++r) init_rank(r);
  }

  // Runs every role of every rank to completion (or abort) on host threads.
  void run() {
    std::vector<std::thread> threads;
    for (int r = 0; r < config_.world_size; ++r) {
      for (int w = 0; w < options_.dispatch_workers; ++w) {
        threads.emplace_back([this, r, w] { dispatch_worker(r, w); });
      }
      for (int w = 0; w < options_.gemm_workers; ++w) {
        threads.emplace_back([this, r, w] { gemm_worker(r, w); });
      }
      threads.emplace_back([this, r] { combine(r); });
    }
    for (std::thread& t : threads) t.join();
  }

  std::vector<std::string> errors() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return errors_;
  }
  const StallReport& stall() const { return stall_; }
  bool aborted() const { return abort_ != 0; }
  int combines_verified() const { return combines_verified_.load(); }

  // Every real schedule row dispatched exactly once.
  void expect_every_row_moved_once() const {
    for (int q = 0; q < config_.world_size; ++q) {
      const auto& rows = schedule_.ranks[q].rows;
      for (size_t i = 0; i < rows.size(); ++i) {
        const int expected = mok::is_padding(rows[i]) ? ranks_[q].copies[i].load() : 1;
        ASSERT_EQ(ranks_[q].copies[i].load(), expected) << "rank " << q << " row " << i;
      }
    }
  }

 private:
  void init_rank(int r) {
    RankModel& m = ranks_[r];
    const int T = config_.tokens_per_rank[r];
    const bool shared = config_.shared_width() > 0;
    m.geometry.padded_rows = schedule_.ranks[r].padded_rows();
    m.geometry.tile_m = options_.tile_m;
    m.geometry.minibatch_rows = options_.tile_m * options_.minibatch_tiles;
    m.geometry.ring_slots = options_.ring_slots;
    m.geometry.gate_up_n_tiles = options_.gate_up_n_tiles;
    m.geometry.down_n_tiles = options_.down_n_tiles;
    m.geometry.shared_m_tiles = shared ? (T + options_.tile_m - 1) / options_.tile_m : 0;
    m.geometry.shared_gate_up_n_tiles = options_.shared_gate_up_n_tiles;
    m.geometry.shared_down_n_tiles = options_.shared_down_n_tiles;
    m.geometry.lookahead = options_.lookahead;
    m.counter_words.assign(counter_words(m.geometry), 0u);
    m.counters = carve_counters(m.geometry, m.counter_words.data(), &abort_, &stall_);
    const size_t ring_rows = static_cast<size_t>(m.geometry.ring_tiles()) * options_.tile_m;
    m.ring.assign(ring_rows, kEmpty);
    m.h.assign(ring_rows * options_.gate_up_n_tiles, kEmpty);
    m.shared_h.assign(static_cast<size_t>(m.geometry.shared_m_tiles) * options_.tile_m *
                          options_.shared_gate_up_n_tiles, kEmpty);
    m.shared_out.assign(static_cast<size_t>(T) * options_.shared_down_n_tiles, kEmpty);
    m.combine.assign(static_cast<size_t>(T) * config_.top_k * options_.down_n_tiles, kEmpty);
    m.copies = std::make_unique<std::atomic<int>[]>(schedule_.ranks[r].rows.size());
  }

  void fail(const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (errors_.size() < 20) errors_.push_back(message);
  }

  void delay(std::mt19937& rng, int max_us) {
    if (max_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % max_us));
  }

  int64_t source_tag(int rank, int64_t schedule_row) const {
    const mok::RowSource& src = schedule_.ranks[rank].rows[static_cast<size_t>(schedule_row)];
    return mok::is_padding(src) ? kPadding : token_tag(src.rank, src.token);
  }

  // Dispatch worker w of rank r: m-tiles w, w + workers, ... in order.
  void dispatch_worker(int r, int w) {
    RankModel& m = ranks_[r];
    const ForwardGeometry& g = m.geometry;
    std::mt19937 rng(static_cast<unsigned>(1000 * r + w));
    for (int tile = w; tile < g.m_tiles(); tile += options_.dispatch_workers) {
      const int mb = tile / g.tiles_per_minibatch();
      if (!options_.dispatch_ignores_ring && !wait_ring_free(sync_, m.counters, g, mb, r)) return;
      for (int i = 0; i < g.tile_m; ++i) {
        const int64_t row = static_cast<int64_t>(tile) * g.tile_m + i;
        const mok::RowSource& src = schedule_.ranks[r].rows[static_cast<size_t>(row)];
        // The pull: read the home rank's x (here its tag) into the local ring.
        m.ring[static_cast<size_t>(ring_row_of_tile(g, tile) + i)] =
            mok::is_padding(src) ? kPadding : token_tag(src.rank, src.token);
        m.copies[static_cast<size_t>(row)].fetch_add(1);
        delay(rng, options_.dispatch_delay_us / 4);
      }
      signal_tile_filled(sync_, m.counters, g, tile);
    }
  }

  void gemm_worker(int r, int w) {
    RankModel& m = ranks_[r];
    const ForwardGeometry& g = m.geometry;
    std::mt19937 rng(static_cast<unsigned>(5000 + 1000 * r + w));
    // Like a device GEMM CTA (fetcher, fetch slot, task slot), a worker holds
    // later tickets while the current task waits and runs (here reserved
    // before the waits: the stronger case), so the model also checks that
    // reserving tickets early cannot deadlock the ticket order.
    std::deque<int64_t> held;
    for (int i = 0; i <= options_.tickets_ahead; ++i) held.push_back(take_ticket(sync_, m.counters));
    for (;;) {
      const int64_t ticket = held.front();
      held.pop_front();
      if (ticket >= task_count(g)) return;
      held.push_back(take_ticket(sync_, m.counters));
      const Task task = decode_task(g, ticket);
      delay(rng, options_.gemm_delay_us);
      bool ok = true;
      switch (task.kind) {
        case TaskKind::kSharedGateUp: shared_gate_up(r, task); break;
        case TaskKind::kSharedDown: ok = shared_down(r, task); break;
        case TaskKind::kGateUp: ok = gate_up(r, task); break;
        case TaskKind::kDown: ok = down(r, task); break;
        case TaskKind::kNone: fail("ticket " + std::to_string(ticket) + " decoded to no task"); return;
      }
      if (!ok) return;  // the pass is aborting
    }
  }

  bool gate_up(int r, const Task& task) {
    RankModel& m = ranks_[r];
    const ForwardGeometry& g = m.geometry;
    if (!wait_tile_filled(sync_, m.counters, g, task.m_tile, r)) return false;
    if (!wait_h_free(sync_, m.counters, g, task.minibatch, r)) return false;
    const int base = ring_row_of_tile(g, task.m_tile);
    for (int i = 0; i < g.tile_m; ++i) {
      const int64_t expected = source_tag(r, static_cast<int64_t>(task.m_tile) * g.tile_m + i);
      const int64_t seen = m.ring[static_cast<size_t>(base + i)];
      if (seen != expected) {
        fail("rank " + std::to_string(r) + " gate/up m-tile " + std::to_string(task.m_tile) +
             " row " + std::to_string(i) + ": ring holds " + std::to_string(seen) + ", schedule says " +
             std::to_string(expected));
      }
      m.h[static_cast<size_t>(base + i) * g.gate_up_n_tiles + task.n_tile] = derived(seen, task.n_tile, 1);
    }
    signal_ring_consumed(sync_, m.counters, g, task.minibatch);
    signal_h_ready(sync_, m.counters, g, task.m_tile);
    return true;
  }

  bool down(int r, const Task& task) {
    RankModel& m = ranks_[r];
    const ForwardGeometry& g = m.geometry;
    if (!wait_h_ready(sync_, m.counters, g, task.m_tile, r)) return false;
    const int base = ring_row_of_tile(g, task.m_tile);
    for (int i = 0; i < g.tile_m; ++i) {
      const int64_t row = static_cast<int64_t>(task.m_tile) * g.tile_m + i;
      const int64_t expected = source_tag(r, row);
      for (int n = 0; n < g.gate_up_n_tiles; ++n) {
        const int64_t seen = m.h[static_cast<size_t>(base + i) * g.gate_up_n_tiles + n];
        if (seen != derived(expected, n, 1)) {
          fail("rank " + std::to_string(r) + " down m-tile " + std::to_string(task.m_tile) +
               ": h row " + std::to_string(i) + " column tile " + std::to_string(n) + " is stale");
        }
      }
      const mok::RowSource& src = schedule_.ranks[r].rows[static_cast<size_t>(row)];
      if (mok::is_padding(src)) continue;
      // The push into the home rank's per-(token, slot) row: one writer each.
      int64_t& piece = ranks_[src.rank].combine[(static_cast<size_t>(src.token) * config_.top_k + src.slot) *
                                                    g.down_n_tiles + task.n_tile];
      if (piece != kEmpty) fail("combine row written twice");
      piece = derived(expected, task.n_tile, 2);
    }
    signal_h_consumed(sync_, m.counters, g, task.minibatch);
    signal_down_done(sync_, m.counters);
    return true;
  }

  void shared_gate_up(int r, const Task& task) {
    RankModel& m = ranks_[r];
    const ForwardGeometry& g = m.geometry;
    for (int i = 0; i < g.tile_m; ++i) {
      const int token = task.m_tile * g.tile_m + i;
      const int64_t tag = token < config_.tokens_per_rank[r] ? token_tag(r, token) : kPadding;
      m.shared_h[static_cast<size_t>(token) * g.shared_gate_up_n_tiles + task.n_tile] = derived(tag, task.n_tile, 3);
    }
    signal_shared_h_ready(sync_, m.counters, task.m_tile);
  }

  bool shared_down(int r, const Task& task) {
    RankModel& m = ranks_[r];
    const ForwardGeometry& g = m.geometry;
    if (!wait_shared_h_ready(sync_, m.counters, g, task.m_tile, r)) return false;
    for (int i = 0; i < g.tile_m; ++i) {
      const int token = task.m_tile * g.tile_m + i;
      if (token >= config_.tokens_per_rank[r]) break;
      for (int n = 0; n < g.shared_gate_up_n_tiles; ++n) {
        if (m.shared_h[static_cast<size_t>(token) * g.shared_gate_up_n_tiles + n] !=
            derived(token_tag(r, token), n, 3)) {
          fail("rank " + std::to_string(r) + " shared down read a stale shared h");
        }
      }
      m.shared_out[static_cast<size_t>(token) * g.shared_down_n_tiles + task.n_tile] =
          derived(token_tag(r, token), task.n_tile, 4);
    }
    signal_shared_done(sync_, m.counters);
    return true;
  }

  // The home rank's combine: waits for its shared expert and for every owner
  // to finish, then checks every (token, slot) piece.
  void combine(int r) {
    RankModel& m = ranks_[r];
    if (!wait_shared_done(sync_, m.counters, m.geometry, r)) return;
    for (int owner = 0; owner < config_.world_size; ++owner) {
      if (!wait_down_done(sync_, m.counters, ranks_[owner].counters, ranks_[owner].geometry, r, owner)) return;
    }
    const int k = config_.top_k;
    for (int t = 0; t < config_.tokens_per_rank[r]; ++t) {
      for (int j = 0; j < k; ++j) {
        for (int n = 0; n < options_.down_n_tiles; ++n) {
          const int64_t piece = m.combine[(static_cast<size_t>(t) * k + j) * options_.down_n_tiles + n];
          if (piece != derived(token_tag(r, t), n, 2)) {
            fail("rank " + std::to_string(r) + " token " + std::to_string(t) + " slot " +
                 std::to_string(j) + ": combine piece " + std::to_string(n) + " missing or wrong");
          }
        }
      }
      if (m.geometry.shared_m_tiles > 0) {
        for (int n = 0; n < options_.shared_down_n_tiles; ++n) {
          if (m.shared_out[static_cast<size_t>(t) * options_.shared_down_n_tiles + n] != derived(token_tag(r, t), n, 4)) {
            fail("rank " + std::to_string(r) + " token " + std::to_string(t) + ": shared output missing");
          }
        }
      }
    }
    combines_verified_.fetch_add(1);
  }

  mok::LayerConfig config_;
  ModelOptions options_;
  HostSync sync_;
  mok::WorldSchedule schedule_;
  std::vector<RankModel> ranks_;
  uint32_t abort_ = 0;
  StallReport stall_{};
  mutable std::mutex mutex_;
  std::vector<std::string> errors_;
  std::atomic<int> combines_verified_{0};
};

void run_and_expect_clean(const mok::LayerConfig& config, mok::synthetic::RoutingMode mode,
                          const ModelOptions& options, uint64_t seed) {
  const auto layer = mok::synthetic::make_layer(config, seed, mode);
  ProtocolModel model(config, layer, options);
  model.run();
  for (const std::string& e : model.errors()) ADD_FAILURE() << e;
  ASSERT_FALSE(model.aborted()) << "stalled on " << counter_name(static_cast<CounterId>(model.stall().counter))
                                << " index " << model.stall().index << " target " << model.stall().target
                                << " observed " << model.stall().observed;
  EXPECT_EQ(model.combines_verified(), config.world_size);
  model.expect_every_row_moved_once();
}

TEST(ForwardProtocol, CompletesAndMovesEveryRowOnceUnderRandomDelays) {
  uint64_t seed = 1;
  for (int world : {1, 2, 4}) {
    for (int ring_slots : {1, 2, 3}) {
      for (int minibatch_tiles : {1, 3}) {
       for (int lookahead : {1, 2, 3}) {
        auto config = mok::make_config(mok::find_shape("small"), world, 0);
        for (int r = 0; r < world; ++r) config.tokens_per_rank[r] = 11 + 7 * r;
        ModelOptions options;
        options.ring_slots = ring_slots;
        options.minibatch_tiles = minibatch_tiles;
        options.lookahead = lookahead;
        SCOPED_TRACE(testing::Message() << "R=" << world << " slots=" << ring_slots
                                        << " minibatch_tiles=" << minibatch_tiles << " lookahead=" << lookahead);
        run_and_expect_clean(config, mok::synthetic::RoutingMode::kUniform, options, seed++);
       }
      }
    }
  }
}

// The fewest tickets ahead a worker can hold; keep that case covered too.
TEST(ForwardProtocol, CompletesWithOneTicketHeldAhead) {
  auto config = mok::make_config(mok::find_shape("small"), 2, 8);
  ModelOptions options;
  options.tickets_ahead = 1;
  run_and_expect_clean(config, mok::synthetic::RoutingMode::kUniform, options, 6);
}

TEST(ForwardProtocol, RingFarSmallerThanOneExpertsRows) {
  // Every token on the same k experts: two ranks receive everything, through a
  // ring of one 4-row slot, with ranks of 0 and 1 tokens in the world.
  auto config = mok::make_config(mok::find_shape("small"), std::vector<int>{40, 0, 1, 33});
  ModelOptions options;
  options.ring_slots = 1;
  options.minibatch_tiles = 1;
  options.dispatch_workers = 3;
  options.gemm_workers = 4;
  run_and_expect_clean(config, mok::synthetic::RoutingMode::kSameExperts, options, 77);
}

TEST(ForwardProtocol, NoSharedExpertAndSkewedRouting) {
  auto config = mok::make_config(mok::find_shape("no-shared"), std::vector<int>{25, 9});
  ModelOptions options;
  options.dispatch_delay_us = 50;  // dispatch slower than compute
  options.gemm_delay_us = 5;
  run_and_expect_clean(config, mok::synthetic::RoutingMode::kSkewed, options, 5);
}

TEST(ForwardProtocol, TheChecksCatchADispatchThatIgnoresTheRing) {
  // A planted bug: dispatch refills ring slots without waiting for readers.
  // With slow readers it overwrites rows before they are read; the model
  // must report it (so the clean runs above are evidence, not luck).
  auto config = mok::make_config(mok::find_shape("small"), 1, 48);
  const auto layer = mok::synthetic::make_layer(config, 3, mok::synthetic::RoutingMode::kUniform);
  ModelOptions options;
  options.ring_slots = 1;
  options.minibatch_tiles = 1;
  options.dispatch_ignores_ring = true;
  options.dispatch_workers = 1;  // keeps its (unguarded) counter stores in order
  options.dispatch_delay_us = 0;
  options.gemm_delay_us = 400;
  options.gemm_workers = 1;
  ProtocolModel model(config, layer, options);
  const auto start = std::chrono::steady_clock::now();
  model.run();
  EXPECT_FALSE(model.errors().empty());
  EXPECT_FALSE(model.aborted()) << "ran " << std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::steady_clock::now() - start).count() << " ms";
}

TEST(ForwardProtocol, AStarvedWaitTimesOutWithAReport) {
  auto config = mok::make_config(mok::find_shape("small"), 2, 8);
  const auto layer = mok::synthetic::make_layer(config, 4, mok::synthetic::RoutingMode::kUniform);
  ModelOptions options;
  options.dispatch_workers = 0;  // nobody fills the ring
  options.timeout = std::chrono::milliseconds(200);
  ProtocolModel model(config, layer, options);
  const auto start = std::chrono::steady_clock::now();
  model.run();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_TRUE(model.aborted());
  // Whichever wait gave up first reports: a GEMM worker on the empty ring, a
  // worker that already holds a down task of the starved minibatch (workers
  // hold tickets ahead, so under load its wait can start first), or a
  // combine on an owner that could not finish.
  const auto stalled = static_cast<CounterId>(model.stall().counter);
  EXPECT_TRUE(stalled == CounterId::kTileFilled || stalled == CounterId::kHReady ||
              stalled == CounterId::kDownDone)
      << counter_name(stalled);
  EXPECT_LT(model.stall().observed, model.stall().target);
  if (stalled == CounterId::kTileFilled) {
    EXPECT_EQ(model.stall().target, 1u);
  }
}

// forward_geometry sizes the kernel's task list, the host's task bound and
// the counters: n-tiles per m-tile from the layer, rounded up.
TEST(ForwardProtocol, GeometryCountsTheLayersTiles) {
  // The DeepSeek-V3 slice: I 2048 / 128, H 7168 / 256, 4096 tokens, 288 m-tiles.
  const ForwardGeometry g = forward_geometry(PassShape{128, 2048, 4, 2, 7168, 2048, 2048}, 4096, 288 * 128);
  EXPECT_EQ(g.gate_up_n_tiles, 16);
  EXPECT_EQ(g.down_n_tiles, 28);
  EXPECT_EQ(g.shared_m_tiles, 32);
  EXPECT_EQ(g.shared_gate_up_n_tiles, 16);
  EXPECT_EQ(g.shared_down_n_tiles, 28);
  EXPECT_EQ(g.m_tiles(), 288);
  EXPECT_EQ(task_count(g), (32 + 288) * (16 + 28));
  // Partial tiles round up; no shared expert means no shared tasks.
  const ForwardGeometry h = forward_geometry(PassShape{128, 1024, 2, 1, 320, 192, 0}, 100, 0);
  EXPECT_EQ(h.gate_up_n_tiles, 2);
  EXPECT_EQ(h.down_n_tiles, 2);
  EXPECT_EQ(h.shared_m_tiles, 0);
  EXPECT_EQ(task_count(h), 0);
}

TEST(ForwardProtocol, TaskOrderCoversEveryTaskOnceInTopologicalOrder) {
  for (int minibatch_tiles : {1, 2, 3}) {
    for (int ring_slots : {1, 2, 3}) {
      for (int lookahead : {1, 2, 4}) {
        ForwardGeometry g{};
        g.padded_rows = 7 * 8;
        g.tile_m = 8;
        g.minibatch_rows = 8 * minibatch_tiles;  // 3 tiles: minibatches of 3, 3 and 1 tiles
        g.ring_slots = ring_slots;
        g.gate_up_n_tiles = 4;
        g.down_n_tiles = 5;
        g.shared_m_tiles = 2;
        g.shared_gate_up_n_tiles = 3;
        g.shared_down_n_tiles = 2;
        g.lookahead = lookahead;
        SCOPED_TRACE(testing::Message() << "minibatch_tiles=" << minibatch_tiles << " slots=" << ring_slots
                                        << " lookahead=" << lookahead);
        std::vector<int> gate_up(static_cast<size_t>(g.m_tiles() * g.gate_up_n_tiles), 0);
        std::vector<int> down(static_cast<size_t>(g.m_tiles() * g.down_n_tiles), 0);
        std::vector<int> down_done_of_minibatch(static_cast<size_t>(g.minibatches()), 0);
        int shared = 0;
        for (int64_t ticket = 0; ticket < task_count(g); ++ticket) {
          const Task t = decode_task(g, ticket);
          ASSERT_NE(t.kind, TaskKind::kNone) << ticket;
          if (t.kind == TaskKind::kGateUp) {
            ++gate_up[static_cast<size_t>(t.m_tile * g.gate_up_n_tiles + t.n_tile)];
            ASSERT_EQ(t.minibatch, t.m_tile / minibatch_tiles);
            // h slot reuse: every down task of minibatch mb - ring_slots came first.
            const int older = t.minibatch - ring_slots;
            if (older >= 0) {
              EXPECT_EQ(down_done_of_minibatch[static_cast<size_t>(older)],
                        g.tiles_in_minibatch(older) * g.down_n_tiles) << ticket;
            }
          } else if (t.kind == TaskKind::kDown) {
            ASSERT_EQ(t.minibatch, t.m_tile / minibatch_tiles);
            // Every gate/up of the same m-tile came first.
            for (int n = 0; n < g.gate_up_n_tiles; ++n) {
              EXPECT_EQ(gate_up[static_cast<size_t>(t.m_tile * g.gate_up_n_tiles + n)], 1) << ticket;
            }
            ++down[static_cast<size_t>(t.m_tile * g.down_n_tiles + t.n_tile)];
            ++down_done_of_minibatch[static_cast<size_t>(t.minibatch)];
          } else {
            ++shared;
          }
        }
        for (int c : gate_up) EXPECT_EQ(c, 1);
        for (int c : down) EXPECT_EQ(c, 1);
        EXPECT_EQ(shared, 2 * (3 + 2));
        EXPECT_EQ(decode_task(g, task_count(g)).kind, TaskKind::kNone);
      }
    }
  }
}

}  // namespace
