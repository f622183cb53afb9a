// The CPU model of a pass's flow control, driven by its table
// (src/protocol/pass_forward.hpp, or the FP8 forward's
// src/protocol/pass_forward_fp8.hpp): host threads stand in for the SM roles of
// every rank (dispatch workers, GEMM workers taking tickets, the combine),
// with random delays, and run the very functions of src/protocol/ (the
// ticket order, counter targets, signal/wait). A GEMM worker knows no task
// kind: it reads the kind's operand rows, checks them, writes its output
// rows and signals, all as the table says. Data are tags, not numbers: each
// operand row must hold exactly what the schedule and the writing kind say
// when a task reads it, every (token, slot) result must land exactly once,
// and the pass must finish. A second group of tests checks the table itself:
// the ticket order covers every task once, and every wait is satisfied by
// signals of smaller tickets only, with targets that count them exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "mok/presets.hpp"
#include "pass_test_support.hpp"
#include "mok/schedule.hpp"
#include "mok/synthetic.hpp"
#include "protocol/host_sync.hpp"
#include "protocol/pass_backward.hpp"
#include "protocol/pass_forward.hpp"
#include "protocol/pass_forward_fp8.hpp"

namespace {

using namespace mok::protocol;
using Pass = ForwardPass;

constexpr int64_t kEmpty = -1;    // never written
constexpr int64_t kPadding = -2;  // a padding row's content

int64_t token_tag(int rank, int token) { return (static_cast<int64_t>(rank) << 32) | token; }
// What a task of kind `kind` derived from a tag in its n-tile n: any
// injective mix will do.
int64_t derived(int64_t tag, int n_tile, int kind) { return tag * 1009 + n_tile * 17 + (kind + 1) * 100003; }

// The kind that writes a tensor (-1: dispatch writes it, or it is an input).
template <class P>
int writer_of(Tensor t) {
  for (int k = 0; k < P::kNumKinds; ++k) {
    if (P::kKinds[k].out == t) return k;
  }
  return -1;
}

struct ModelOptions {
  int tile_m = 4;
  int token_tile_m = 0;  // rows of a token tile (0: tile_m)
  int minibatch_tiles = 2;
  int ring_slots = 2;
  // n-tiles of one m-tile per kind of the forward (and of the FP8 forward,
  // which has its kinds); a layer without a shared expert has none of the
  // token-row kinds.
  int n_tiles[ForwardPass::kNumKinds] = {2, 2, 2, 3};
  int lookahead = 1;
  uint32_t n_major_kinds = 0;  // PassShape::n_major_kinds: kinds whose pipeline blocks run n-tile major
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

// One rank's tensors as tags: rows x pieces (a piece per n-tile of the kind
// that writes the tensor).
template <class P>
struct RankModel {
  PassGeometry<P> geometry{};
  std::vector<uint32_t> counter_words;
  PassCounters<P> counters{};
  std::map<Tensor, std::vector<int64_t>> tensors;
  std::unique_ptr<std::atomic<int>[]> copies;  // per schedule row: times dispatched
};

// P: a forward table (ForwardPass, or one that derives its kinds, counters
// and roles from it: ForwardFp8Pass).
template <class P = ForwardPass>
class ProtocolModel {
  static_assert(ForwardTable<P> && P::kNumKinds == ForwardPass::kNumKinds);

 public:
  ProtocolModel(const mok::LayerConfig& config, const mok::synthetic::Layer& layer, const ModelOptions& options)
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
  bool has_shared() const { return config_.shared_width() > 0; }

  void init_rank(int r) {
    RankModel<P>& m = ranks_[r];
    const int T = config_.tokens_per_rank[r];
    PassGeometry<P>& g = m.geometry;
    g.padded_rows = schedule_.ranks[r].padded_rows();
    g.tile_m = options_.tile_m;
    g.minibatch_rows = options_.tile_m * options_.minibatch_tiles;
    g.ring_slots = options_.ring_slots;
    g.lookahead = options_.lookahead;
    g.token_tile_m = options_.token_tile_m > 0 ? options_.token_tile_m : options_.tile_m;
    g.token_m_tiles = (T + g.token_tile_m - 1) / g.token_tile_m;
    g.n_major_kinds = options_.n_major_kinds;
    for (int k = 0; k < P::kNumKinds; ++k) {
      const bool token_kind = P::kKinds[k].rows == Rows::kTokens;
      g.n_tiles[k] = token_kind && !has_shared() ? 0 : options_.n_tiles[k];
    }
    m.counter_words.assign(counter_words(g), 0u);
    m.counters = carve_counters(g, m.counter_words.data(), &abort_, &stall_);
    const size_t ring_rows = static_cast<size_t>(g.ring_tiles()) * options_.tile_m;
    const size_t token_rows = static_cast<size_t>(g.token_m_tiles) * g.token_tile_m;
    m.tensors[Tensor::kRingX].assign(ring_rows, kEmpty);
    for (int k = 0; k < P::kNumKinds; ++k) {
      const TaskKindSpec& spec = P::kKinds[k];
      const size_t rows = spec.out == Tensor::kHomeCombine ? static_cast<size_t>(T) * config_.top_k
                          : spec.rows == Rows::kSchedule   ? ring_rows
                                                           : token_rows;
      m.tensors[spec.out].assign(rows * std::max(1, g.n_tiles[k]), kEmpty);
    }
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
    RankModel<P>& m = ranks_[r];
    const PassGeometry<P>& g = m.geometry;
    std::mt19937 rng(static_cast<unsigned>(1000 * r + w));
    for (int tile = w; tile < g.m_tiles(); tile += options_.dispatch_workers) {
      if (!options_.dispatch_ignores_ring && !wait_ring_free(sync_, m.counters, g, tile, r)) return;
      for (int i = 0; i < g.tile_m; ++i) {
        const int64_t row = static_cast<int64_t>(tile) * g.tile_m + i;
        // The pull: read the home rank's x (here its tag) into the local ring.
        m.tensors[Tensor::kRingX][static_cast<size_t>(ring_row_of_tile(g, tile) + i)] = source_tag(r, row);
        m.copies[static_cast<size_t>(row)].fetch_add(1);
        delay(rng, options_.dispatch_delay_us / 4);
      }
      signal_tile_filled(sync_, m.counters, g, tile);
    }
  }

  void gemm_worker(int r, int w) {
    RankModel<P>& m = ranks_[r];
    const PassGeometry<P>& g = m.geometry;
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
      if (task.kind == kNoTask) {
        fail("ticket " + std::to_string(ticket) + " decoded to no task");
        return;
      }
      delay(rng, options_.gemm_delay_us);
      bool ok = true;
      visit_kind<P>(task.kind, [&](auto K) {
        using Spec = KindSpec<P, index_of<decltype(K)>>;
        ok = wait_inputs<Spec>(sync_, m.counters, g, task.minibatch, task.m_tile, r);
        if (!ok) return;
        run_task(r, task);
        signal_outputs<Spec>(sync_, m.counters, g, task.minibatch, task.m_tile);
      });
      if (!ok) return;  // the pass is aborting
    }
  }

  // The task's work as its table entry says: read every row of its A operand
  // (checking each against what the schedule and the operand's writer say),
  // then write its n-tile of its output rows.
  void run_task(int r, const Task& task) {
    RankModel<P>& m = ranks_[r];
    const PassGeometry<P>& g = m.geometry;
    const TaskKindSpec& spec = P::kKinds[task.kind];
    const int reader_pieces = writer_of<P>(spec.a) >= 0 ? g.n_tiles[writer_of<P>(spec.a)] : 1;
    const int out_pieces = g.n_tiles[task.kind];
    // An m-tile of schedule rows, or a token tile.
    const int height = spec.rows == Rows::kSchedule ? g.tile_m : g.token_tile_m;
    for (int i = 0; i < height; ++i) {
      int64_t tag, row;  // the row's source, and its row in the rank's tensors
      if (spec.rows == Rows::kSchedule) {
        tag = source_tag(r, static_cast<int64_t>(task.m_tile) * g.tile_m + i);
        row = ring_row_of_tile(g, task.m_tile) + i;
      } else {
        row = static_cast<int64_t>(task.m_tile) * g.token_tile_m + i;
        if (row >= config_.tokens_per_rank[r]) break;  // past the last token: nothing read or written
        tag = token_tag(r, static_cast<int>(row));
      }
      // Read A.
      if (spec.a != Tensor::kX) {
        const std::vector<int64_t>& a = m.tensors[spec.a];
        for (int p = 0; p < reader_pieces; ++p) {
          const int64_t seen = a[static_cast<size_t>(row) * reader_pieces + p];
          const int64_t expected = spec.a == Tensor::kRingX ? tag : derived(tag, p, writer_of<P>(spec.a));
          if (seen != expected) {
            fail("rank " + std::to_string(r) + " kind " + std::to_string(task.kind) + " m-tile " +
                 std::to_string(task.m_tile) + " row " + std::to_string(i) + ": operand piece " + std::to_string(p) +
                 " holds " + std::to_string(seen) + ", expected " + std::to_string(expected));
          }
        }
      }
      // Write the output.
      const int64_t value = derived(tag, task.n_tile, task.kind);
      if (spec.out == Tensor::kHomeCombine) {
        if (tag == kPadding) continue;
        const mok::RowSource& src = schedule_.ranks[r].rows[static_cast<size_t>(task.m_tile) * g.tile_m + i];
        // The push into the home rank's per-(token, slot) row: one writer each.
        int64_t& piece = ranks_[src.rank].tensors[Tensor::kHomeCombine]
                             [(static_cast<size_t>(src.token) * config_.top_k + src.slot) * out_pieces + task.n_tile];
        if (piece != kEmpty) fail("home row written twice");
        piece = value;
      } else {
        m.tensors[spec.out][static_cast<size_t>(row) * out_pieces + task.n_tile] = value;
      }
    }
  }

  // The home rank's combine: waits for its shared expert and for every owner
  // to finish, then checks every (token, slot) piece.
  void combine(int r) {
    RankModel<P>& m = ranks_[r];
    if (!wait_shared_done(sync_, m.counters, m.geometry, r)) return;
    for (int owner = 0; owner < config_.world_size; ++owner) {
      if (!wait_down_done(sync_, m.counters, ranks_[owner].counters, ranks_[owner].geometry, r, owner)) return;
    }
    const int k = config_.top_k;
    const int home_writer = writer_of<P>(Tensor::kHomeCombine), shared_writer = writer_of<P>(Tensor::kSharedOut);
    const int home_pieces = m.geometry.n_tiles[home_writer], shared_pieces = m.geometry.n_tiles[shared_writer];
    for (int t = 0; t < config_.tokens_per_rank[r]; ++t) {
      for (int j = 0; j < k; ++j) {
        for (int n = 0; n < home_pieces; ++n) {
          const int64_t piece = m.tensors[Tensor::kHomeCombine][(static_cast<size_t>(t) * k + j) * home_pieces + n];
          if (piece != derived(token_tag(r, t), n, home_writer)) {
            fail("rank " + std::to_string(r) + " token " + std::to_string(t) + " slot " + std::to_string(j) +
                 ": home piece " + std::to_string(n) + " missing or wrong");
          }
        }
      }
      for (int n = 0; n < shared_pieces; ++n) {
        if (m.tensors[Tensor::kSharedOut][static_cast<size_t>(t) * shared_pieces + n] !=
            derived(token_tag(r, t), n, shared_writer)) {
          fail("rank " + std::to_string(r) + " token " + std::to_string(t) + ": shared output missing");
        }
      }
    }
    combines_verified_.fetch_add(1);
  }

  mok::LayerConfig config_;
  ModelOptions options_;
  HostSync sync_;
  mok::WorldSchedule schedule_;
  std::vector<RankModel<P>> ranks_;
  uint32_t abort_ = 0;
  StallReport stall_{};
  mutable std::mutex mutex_;
  std::vector<std::string> errors_;
  std::atomic<int> combines_verified_{0};
};

template <class P = ForwardPass>
void run_and_expect_clean(const mok::LayerConfig& config, mok::synthetic::RoutingMode mode,
                          const ModelOptions& options, uint64_t seed) {
  const auto layer = mok::synthetic::make_layer(config, seed, mode);
  ProtocolModel<P> model(config, layer, options);
  model.run();
  for (const std::string& e : model.errors()) ADD_FAILURE() << e;
  ASSERT_FALSE(model.aborted()) << "stalled on " << counter_name(static_cast<CounterId>(model.stall().counter))
                                << " index " << model.stall().index << " target " << model.stall().target
                                << " observed " << model.stall().observed;
  EXPECT_EQ(model.combines_verified(), config.world_size);
  model.expect_every_row_moved_once();
}

TEST(PassProtocol, CompletesAndMovesEveryRowOnceUnderRandomDelays) {
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

// The gate/up blocks in n-tile major order (the host's choice for layers of
// few, wide experts: world::forward_n_major_kinds): the same pass, every row
// moved once, under random delays.
TEST(PassProtocol, CompletesWithTheGateUpBlocksNTileMajor) {
  uint64_t seed = 101;
  for (int world : {1, 2}) {
    for (int ring_slots : {1, 2}) {
      for (int lookahead : {1, 2}) {
        auto config = mok::make_config(mok::find_shape("small"), world, 0);
        for (int r = 0; r < world; ++r) config.tokens_per_rank[r] = 13 + 5 * r;
        ModelOptions options;
        options.ring_slots = ring_slots;
        options.minibatch_tiles = 3;
        options.lookahead = lookahead;
        options.n_tiles[ForwardPass::kGateUp] = 4;
        options.n_major_kinds = 1u << ForwardPass::kGateUp;
        SCOPED_TRACE(testing::Message() << "R=" << world << " slots=" << ring_slots << " lookahead=" << lookahead);
        run_and_expect_clean(config, mok::synthetic::RoutingMode::kUniform, options, seed++);
      }
    }
  }
}

// The fewest tickets ahead a worker can hold; keep that case covered too.
TEST(PassProtocol, CompletesWithOneTicketHeldAhead) {
  auto config = mok::make_config(mok::find_shape("small"), 2, 8);
  ModelOptions options;
  options.tickets_ahead = 1;
  run_and_expect_clean(config, mok::synthetic::RoutingMode::kUniform, options, 6);
}

TEST(PassProtocol, RingFarSmallerThanOneExpertsRows) {
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

TEST(PassProtocol, NoSharedExpertAndSkewedRouting) {
  auto config = mok::make_config(mok::find_shape("no-shared"), std::vector<int>{25, 9});
  ModelOptions options;
  options.dispatch_delay_us = 50;  // dispatch slower than compute
  options.gemm_delay_us = 5;
  run_and_expect_clean(config, mok::synthetic::RoutingMode::kSkewed, options, 5);
}

// The FP8 forward's table (pass_forward_fp8.hpp) over two tile heights, the
// rank's own tokens in token tiles twice its m-tile (8 rows against 4 here).
// The kernel now runs one height (128 and 128); its first version ran 64-row
// m-tiles under 128-row token tiles, and the model keeps that case checked.
// The shared
// expert's rows each task reads and every token the combine checks lie where
// the token tiles the geometry counts put them.
TEST(PassProtocol, TheFp8TableCompletesWithTokenTilesTwiceTheMTile) {
  uint64_t seed = 100;
  for (int world : {1, 2, 4}) {
    for (int ring_slots : {1, 2, 3}) {
      for (int minibatch_tiles : {1, 3}) {
        for (int lookahead : {1, 2}) {
          auto config = mok::make_config(mok::find_shape("small"), world, 0);
          for (int r = 0; r < world; ++r) config.tokens_per_rank[r] = 11 + 7 * r;
          ModelOptions options;
          options.token_tile_m = 2 * options.tile_m;
          options.ring_slots = ring_slots;
          options.minibatch_tiles = minibatch_tiles;
          options.lookahead = lookahead;
          SCOPED_TRACE(testing::Message() << "R=" << world << " slots=" << ring_slots
                                          << " minibatch_tiles=" << minibatch_tiles << " lookahead=" << lookahead);
          run_and_expect_clean<ForwardFp8Pass>(config, mok::synthetic::RoutingMode::kUniform, options, seed++);
        }
      }
    }
  }
  // Every token on the same experts, through a one-tile ring, with ranks of
  // 0 and 1 tokens (less than a token tile) and one of exactly two tiles.
  auto config = mok::make_config(mok::find_shape("small"), std::vector<int>{40, 0, 1, 16});
  ModelOptions options;
  options.token_tile_m = 2 * options.tile_m;
  options.ring_slots = 1;
  options.minibatch_tiles = 1;
  options.gemm_workers = 4;
  run_and_expect_clean<ForwardFp8Pass>(config, mok::synthetic::RoutingMode::kSameExperts, options, 78);
}

TEST(PassProtocol, TheChecksCatchADispatchThatIgnoresTheRing) {
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
  ProtocolModel<> model(config, layer, options);
  const auto start = std::chrono::steady_clock::now();
  model.run();
  EXPECT_FALSE(model.errors().empty());
  EXPECT_FALSE(model.aborted()) << "ran " << std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::steady_clock::now() - start).count() << " ms";
}

TEST(PassProtocol, AStarvedWaitTimesOutWithAReport) {
  auto config = mok::make_config(mok::find_shape("small"), 2, 8);
  const auto layer = mok::synthetic::make_layer(config, 4, mok::synthetic::RoutingMode::kUniform);
  ModelOptions options;
  options.dispatch_workers = 0;  // nobody fills the ring
  options.timeout = std::chrono::milliseconds(200);
  ProtocolModel<> model(config, layer, options);
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

// ---- the table itself ---------------------------------------------------------

// pass_geometry sizes the kernel's task list, the host's task bound and the
// counters: n-tiles per m-tile from the layer and the kinds' tile shapes,
// rounded up.
TEST(PassTable, GeometryCountsTheLayersTiles) {
  // The DeepSeek-V3 slice: I 2048 / 128, H 7168 / 256, 4096 tokens, 288 m-tiles.
  const ForwardGeometry g = forward_geometry(PassShape{128, 2048, 4, 2, 7168, 2048, 2048}, 4096, 288 * 128);
  EXPECT_EQ(g.n_tiles[Pass::kGateUp], 16);
  EXPECT_EQ(g.n_tiles[Pass::kDown], 28);
  EXPECT_EQ(g.token_m_tiles, 32);
  EXPECT_EQ(g.n_tiles[Pass::kSharedGateUp], 16);
  EXPECT_EQ(g.n_tiles[Pass::kSharedDown], 28);
  EXPECT_EQ(g.m_tiles(), 288);
  EXPECT_EQ(task_count(g), (32 + 288) * (16 + 28));
  EXPECT_EQ(max_task_count<Pass>(PassShape{128, 2048, 4, 2, 7168, 2048, 2048}, 4096, 288 * 128 - 5),
            task_count(g));
  // Partial tiles round up; no shared expert means no shared tasks.
  const ForwardGeometry h = forward_geometry(PassShape{128, 1024, 2, 1, 320, 192, 0}, 100, 0);
  EXPECT_EQ(h.n_tiles[Pass::kGateUp], 2);
  EXPECT_EQ(h.n_tiles[Pass::kDown], 2);
  EXPECT_EQ(h.n_tiles[Pass::kSharedGateUp], 0);
  EXPECT_EQ(h.n_tiles[Pass::kSharedDown], 0);
  EXPECT_EQ(task_count(h), 0);
  // The n-tile widths are the kinds' tile shapes'.
  EXPECT_EQ(Pass::kKinds[Pass::kGateUp].tile.out_cols(), 128);
  EXPECT_EQ(Pass::kKinds[Pass::kDown].tile.out_cols(), 256);
}

// The FP8 forward's first kernel's table: 64-row split-N routed tiles
// beside 128-row bf16 shared-expert tiles (128 x 128). The FP8 forward now runs 128-row
// tiles throughout, but a table whose heights differ stays expressible, and
// its geometry is checked on this one.
inline constexpr mok::GemmTileShape kSplitNGateUpTile{64, 256, mok::EpilogueKind::kSwiGLUQuantize, mok::ElementType::kE4M3};
inline constexpr mok::GemmTileShape kSplitNDownTile{64, 256, mok::EpilogueKind::kPlain, mok::ElementType::kE4M3};
inline constexpr mok::GemmTileShape kSharedSwiGLU128{128, 128, mok::EpilogueKind::kSwiGLU};
inline constexpr mok::GemmTileShape kSharedPlain128{128, 128, mok::EpilogueKind::kPlain};
struct SplitNFp8Pass : ForwardFp8Pass {
  static constexpr TaskKindSpec kKinds[kNumKinds] = {
      with_tile(ForwardFp8Pass::kKinds[kSharedGateUp], kSharedSwiGLU128),
      with_tile(ForwardFp8Pass::kKinds[kSharedDown], kSharedPlain128),
      with_tile(ForwardFp8Pass::kKinds[kGateUp], kSplitNGateUpTile),
      with_tile(ForwardFp8Pass::kKinds[kDown], kSplitNDownTile)};
};
static_assert(pass_table_is_consistent<SplitNFp8Pass>());

// The FP8 forward's table runs one height: 128-row m-tiles and token tiles.
TEST(PassTable, TheFp8TableRunsOneHeight) {
  EXPECT_EQ(kinds_block_m<ForwardFp8Pass>(Rows::kSchedule), 128);
  EXPECT_EQ(kinds_block_m<ForwardFp8Pass>(Rows::kTokens), 128);
  EXPECT_EQ(shape_token_tile_m<ForwardFp8Pass>(), 0);
  EXPECT_TRUE(shape_fits_tiles<ForwardFp8Pass>(PassShape{128, 256, 2, 2, 7168, 2048, 2048}));
  EXPECT_FALSE(shape_fits_tiles<ForwardFp8Pass>(PassShape{64, 256, 2, 2, 7168, 2048, 2048}));
}

// A table with two heights: schedule m-tiles of 64 rows (the split-N routed
// tiles), token tiles of 128 (the bf16 shared-expert tiles); the token tiles
// count the tokens, and everything that counts per token tile (the shared
// expert's tasks, shared_h_ready) follows them.
TEST(PassTable, TheFp8GeometryCountsTokenTilesByTheTokenTile) {
  using Fp8 = SplitNFp8Pass;
  PassShape shape{64, 256, 2, 2, 7168, 2048, 2048};
  shape.token_tile_m = shape_token_tile_m<Fp8>();
  EXPECT_EQ(shape.token_tile_m, 128);
  EXPECT_TRUE(shape_fits_tiles<Fp8>(shape));
  const PassGeometry<Fp8> g = pass_geometry<Fp8>(shape, 300, 10 * 64);
  EXPECT_EQ(g.tile_m, 64);
  EXPECT_EQ(g.token_tile_m, 128);
  EXPECT_EQ(g.token_m_tiles, 3);  // 300 tokens: 128 + 128 + 44
  EXPECT_EQ(g.m_tiles(), 10);
  EXPECT_EQ(g.tiles_per_minibatch(), 4);
  EXPECT_EQ(counter_length(g, Span::kTokenTile), 3);
  // n-tiles: gate/up 128 h columns a tile (I 2048), down 256 (H 7168); the
  // shared expert's 128 x 128 bf16 tiles: 64 shared_h columns, 128 output ones.
  EXPECT_EQ(g.n_tiles[Fp8::kGateUp], 16);
  EXPECT_EQ(g.n_tiles[Fp8::kDown], 28);
  EXPECT_EQ(g.n_tiles[Fp8::kSharedGateUp], 32);
  EXPECT_EQ(g.n_tiles[Fp8::kSharedDown], 56);
  EXPECT_EQ(g.kind_m_tiles(Fp8::kSharedDown), 3);
  EXPECT_EQ(prologue_task_count(g), 3 * (32 + 56));
  EXPECT_EQ(task_count(g), 3 * (32 + 56) + 10 * (16 + 28));
  EXPECT_EQ(max_task_count<Fp8>(shape, 300, 10 * 64 - 7), task_count(g));
  // The last prologue ticket is the last token tile's last shared down task.
  const Task last = decode_task(g, prologue_task_count(g) - 1);
  EXPECT_EQ(last.kind, Fp8::kSharedDown);
  EXPECT_EQ(last.m_tile, 2);
  EXPECT_EQ(last.n_tile, 55);
  // Targets per token tile: every shared gate/up n-tile of the tile; the
  // whole pass's shared_done: every shared down task.
  EXPECT_EQ(signals_per_generation(g, Fp8::kSharedHReady), 32u);
  EXPECT_EQ(signals_per_generation(g, Fp8::kSharedDone), 3u * 56u);

  // token_tile_m 0 means the m-tile: 5 token tiles of 64, which the FP8
  // table's tiles do not run (the host must refuse the shape).
  shape.token_tile_m = 0;
  EXPECT_EQ(pass_geometry<Fp8>(shape, 300, 0).token_m_tiles, 5);
  EXPECT_FALSE(shape_fits_tiles<Fp8>(shape));
  EXPECT_FALSE(shape_fits_tiles<Fp8>(PassShape{128, 256, 2, 2, 7168, 2048, 2048}));
  // Every bf16 table has one height: its token tile is its m-tile.
  EXPECT_EQ(shape_token_tile_m<ForwardPass>(), 0);
  EXPECT_EQ(shape_token_tile_m<BackwardPass>(), 0);
  EXPECT_EQ(shape_token_tile_m<BackwardRecomputePass>(), 0);
  const PassShape bf16{128, 2048, 4, 2, 7168, 2048, 2048};
  EXPECT_TRUE(shape_fits_tiles<ForwardPass>(bf16));
  EXPECT_EQ(forward_geometry(bf16, 300, 0).token_tile_m, 128);
  EXPECT_EQ(forward_geometry(bf16, 300, 0).token_m_tiles, 3);
}

// The rule's heights: a table whose own-token kinds, or whose schedule
// kinds, run tiles of different heights is refused (one set of m-tiles
// counts each).
struct MixedTokenTiles : ForwardFp8Pass {
  static constexpr TaskKindSpec kKinds[kNumKinds] = {
      ForwardFp8Pass::kKinds[kSharedGateUp], with_tile(ForwardFp8Pass::kKinds[kSharedDown], kSplitNDownTile),
      ForwardFp8Pass::kKinds[kGateUp], ForwardFp8Pass::kKinds[kDown]};
};
struct MixedScheduleTiles : ForwardFp8Pass {
  static constexpr TaskKindSpec kKinds[kNumKinds] = {
      ForwardFp8Pass::kKinds[kSharedGateUp], ForwardFp8Pass::kKinds[kSharedDown], ForwardFp8Pass::kKinds[kGateUp],
      with_tile(ForwardFp8Pass::kKinds[kDown], kSplitNDownTile)};
};
static_assert(!pass_table_is_consistent<MixedTokenTiles>() && !pass_table_is_consistent<MixedScheduleTiles>());
static_assert(pass_table_is_consistent<ForwardFp8Pass>() && pass_table_is_consistent<ForwardPass>());

// The counters, carved in table order: every array its span's length, then
// the ticket, the schedule's four words, the abort flag and the report.
TEST(PassTable, CounterLayoutFollowsTheTable) {
  const ForwardGeometry g = forward_geometry(PassShape{128, 512, 3, 2, 1024, 512, 256}, 300, 0);
  std::vector<uint32_t> words(counter_words(g), 0u);
  const ForwardCounters c = carve_counters(g, words.data());
  size_t at = 0;
  for (int i = 0; i < Pass::kNumCounters; ++i) {
    EXPECT_EQ(c.counter[i], words.data() + at) << i;
    at += static_cast<size_t>(counter_length(g, Pass::kCounters[i].span));
  }
  EXPECT_EQ(counter_length(g, Span::kRingTile), 3 * 4);
  EXPECT_EQ(counter_length(g, Span::kRingSlot), 3);
  EXPECT_EQ(counter_length(g, Span::kTokenTile), 3);
  EXPECT_EQ(c.ticket, words.data() + at);
  EXPECT_EQ(c.schedule_rows, words.data() + at + 4);
  EXPECT_EQ(c.abort, words.data() + at + 5);
  EXPECT_EQ(reinterpret_cast<uint32_t*>(c.stall) + sizeof(StallReport) / 4, words.data() + words.size());
}

// One signal as the order sees it: the counter index it moves, the
// generation it belongs to, and the largest ticket it depends on (a task's
// own ticket; for dispatch, the tickets its own waits depend on).
struct SignalEvent {
  int32_t index;
  uint32_t generation;
  int64_t depends_on;
};

// The ticket order against the table, for one geometry: every task once, in
// an order where every wait is met by signals that depend only on smaller
// tickets, and every target counts exactly the signals that precede it.
// Returns what is wrong (empty: nothing). `expert_first_m_tile` ([El + 1],
// passes with per-expert work): where each local expert's schedule m-tiles
// start.
template <class P>
std::vector<std::string> table_order_violations(const PassGeometry<P>& g,
                                                const std::vector<int32_t>& expert_first_m_tile = {}) {
  using test_support::expert_of_work;
  std::vector<std::string> errors;
  auto fail = [&](const std::string& e) {
    if (errors.size() < 20) errors.push_back(e);
  };
  auto expert_of = [&](int32_t kind, int32_t m_tile) { return expert_of_work(g, expert_first_m_tile, kind, m_tile); };
  constexpr int32_t kScheduleKind = test_support::first_schedule_kind<P>();
  if (!buffers_hold_schedule(g)) fail("the pass needs its whole schedule resident and its buffers are too small");

  std::vector<Task> tasks;
  std::map<std::tuple<int, int, int>, int> seen;  // (kind, m_tile, n_tile) -> times
  for (int64_t ticket = 0; ticket < task_count(g); ++ticket) {
    const Task t = decode_task(g, ticket);
    if (t.kind == kNoTask || t.n_tile >= g.n_tiles[t.kind] || t.m_tile >= g.kind_m_tiles(t.kind) ||
        (P::kKinds[t.kind].rows == Rows::kSchedule && t.minibatch != t.m_tile / g.tiles_per_minibatch())) {
      fail("ticket " + std::to_string(ticket) + " decodes to no valid task");
      return errors;
    }
    ++seen[{t.kind, t.m_tile, t.n_tile}];
    tasks.push_back(t);
  }
  if (decode_task(g, task_count(g)).kind != kNoTask) fail("a ticket past the end decodes to a task");
  for (int k = 0; k < P::kNumKinds; ++k) {
    for (int m = 0; m < g.kind_m_tiles(k); ++m) {
      for (int n = 0; n < g.n_tiles[k]; ++n) {
        if (seen[{k, m, n}] != 1) fail("task " + std::to_string(k) + " " + std::to_string(m) + " " + std::to_string(n) +
                                       " handed out " + std::to_string(seen[{k, m, n}]) + " times");
      }
    }
  }
  // The prologue (token rows, no schedule needed) comes first: the GEMM
  // roles read the schedule only for tickets past it.
  for (int64_t ticket = 0; ticket < static_cast<int64_t>(tasks.size()); ++ticket) {
    if ((P::kKinds[tasks[static_cast<size_t>(ticket)].kind].rows == Rows::kTokens) != (ticket < prologue_task_count(g))) {
      fail("ticket " + std::to_string(ticket) + " is on the wrong side of the prologue");
    }
  }

  // Every signal, by counter.
  std::vector<std::vector<SignalEvent>> events(P::kNumCounters);
  auto add_signals = [&](const CounterSignal (&signals)[kMaxSignals], int32_t mb, int32_t m_tile, int64_t depends_on,
                         ExpertOfWork of) {
    for (const CounterSignal& s : signals) {
      if (s.counter == kNoCounter) continue;
      const Span span = P::kCounters[s.counter].span;
      events[s.counter].push_back({counter_index(g, span, mb, m_tile, of.expert),
                                   span_cycles(span) ? g.generation_of(mb) : 0u, depends_on});
    }
  };
  for (size_t i = 0; i < tasks.size(); ++i) {
    add_signals(P::kKinds[tasks[i].kind].signals, tasks[i].minibatch, tasks[i].m_tile, static_cast<int64_t>(i),
                expert_of(tasks[i].kind, tasks[i].m_tile));
  }
  // The signals a wait needs: every signal of its counter index in the
  // generations it covers. Their count must be the target exactly, and the
  // largest ticket they depend on is returned.
  auto needed = [&](CounterWait w, int32_t mb, int32_t m_tile, const std::string& who, ExpertOfWork of = {}) {
    const Span span = P::kCounters[w.counter].span;
    const int32_t index = counter_index(g, span, mb, m_tile, of.expert);
    const uint32_t generation = span_cycles(span) ? g.generation_of(mb) : 0u;
    const uint32_t generations = generation + (w.await == Await::kReady ? 1u : 0u);
    uint32_t count = 0;
    int64_t latest = -1;
    for (const SignalEvent& e : events[w.counter]) {
      if (e.index != index || e.generation >= generations) continue;
      if (P::kCounters[w.counter].stores_generation) {
        count = std::max(count, e.generation + 1);
      } else {
        ++count;
      }
      latest = std::max(latest, e.depends_on);
    }
    if (count != wait_target(g, w, generation, of.schedule_m_tiles)) {
      fail(who + " waiting on counter " + std::to_string(w.counter) + ": target " +
           std::to_string(wait_target(g, w, generation, of.schedule_m_tiles)) + ", signals " + std::to_string(count));
    }
    return latest;
  };
  // Dispatch, m-tile by m-tile in order (a dispatch worker takes its m-tiles
  // in increasing order, so each depends on what the earlier ones waited for).
  int64_t dispatch_depends_on = -1;
  for (int32_t m_tile = 0; m_tile < g.m_tiles(); ++m_tile) {
    const int32_t mb = m_tile / g.tiles_per_minibatch();
    for (const CounterWait& w : P::Dispatch::value.waits) {
      if (w.counter == kNoCounter) continue;
      dispatch_depends_on = std::max(dispatch_depends_on, needed(w, mb, m_tile, "dispatch of m-tile " +
                                                                 std::to_string(m_tile), expert_of(kScheduleKind, m_tile)));
    }
    add_signals(P::Dispatch::value.signals, mb, m_tile, dispatch_depends_on, expert_of(kScheduleKind, m_tile));
  }
  // Every task's waits: met by signals of smaller tickets only.
  for (size_t i = 0; i < tasks.size(); ++i) {
    const Task& t = tasks[i];
    for (const CounterWait& w : P::kKinds[t.kind].waits) {
      if (w.counter == kNoCounter) continue;
      const int64_t latest = needed(w, t.minibatch, t.m_tile, "ticket " + std::to_string(i), expert_of(t.kind, t.m_tile));
      if (latest >= static_cast<int64_t>(i)) {
        fail("ticket " + std::to_string(i) + " (kind " + std::to_string(t.kind) + ") waits on counter " +
             std::to_string(w.counter) + ", raised by ticket " + std::to_string(latest));
      }
    }
  }
  // The combine's waits count every signal of the pass.
  for (const CounterWait& w : P::Combine::value.waits) {
    if (w.counter != kNoCounter) needed(w, 0, 0, "combine");
  }
  return errors;
}

template <class P>
void check_table_order(const PassGeometry<P>& g, const std::vector<int32_t>& expert_first_m_tile = {}) {
  for (const std::string& e : table_order_violations(g, expert_first_m_tile)) ADD_FAILURE() << e;
}

TEST(PassTable, TicketOrderMeetsEveryWaitWithSmallerTickets) {
  for (int minibatch_tiles : {1, 2, 3}) {
    for (int ring_slots : {1, 2, 3}) {
      for (int lookahead : {1, 2, 4}) {
        for (int m_tiles : {0, 1, 7, 12}) {
          ForwardGeometry g{};
          g.padded_rows = m_tiles * 8;
          g.tile_m = 8;
          g.minibatch_rows = 8 * minibatch_tiles;  // 3 tiles, 7 m-tiles: minibatches of 3, 3 and 1 tiles
          g.ring_slots = ring_slots;
          g.lookahead = lookahead;
          g.token_tile_m = 8;
          g.token_m_tiles = 2;
          g.n_tiles[Pass::kSharedGateUp] = 3;
          g.n_tiles[Pass::kSharedDown] = 2;
          g.n_tiles[Pass::kGateUp] = 4;
          g.n_tiles[Pass::kDown] = 5;
          SCOPED_TRACE(testing::Message() << "minibatch_tiles=" << minibatch_tiles << " slots=" << ring_slots
                                          << " lookahead=" << lookahead << " m_tiles=" << m_tiles);
          check_table_order(g);
          g.n_major_kinds = 1u << Pass::kGateUp;  // the host's order for few, wide experts
          check_table_order(g);
        }
      }
    }
  }
  // No shared expert: no token-row tasks at all.
  ForwardGeometry g = forward_geometry(PassShape{8, 16, 2, 2, 512, 256, 0}, 13, 9 * 8);
  EXPECT_EQ(g.n_tiles[Pass::kSharedGateUp], 0);
  check_table_order(g);
}

// The FP8 forward's table, and the two-height table of its first kernel: the
// same check, on geometries of schedules with uneven and empty experts (each
// padded to the m-tile), and (two heights) tokens in token tiles twice the
// m-tile (none, less than one, a partial last one, whole ones).
TEST(PassTable, Fp8ForwardTicketOrderMeetsEveryWaitWithSmallerTickets) {
  constexpr int32_t kTileM = 4;
  for (int minibatch_tiles : {1, 2, 3}) {
    for (int ring_slots : {1, 2, 3}) {
      for (int lookahead : {1, 2}) {
        for (const std::vector<int32_t>& expert_rows : {std::vector<int32_t>{5, 0, 9, 1}, std::vector<int32_t>{16},
                                                        std::vector<int32_t>{0, 0}, std::vector<int32_t>{1, 2, 3, 4, 5}}) {
          for (int tokens : {0, 1, 13, 16}) {
            int32_t padded_rows = 0;
            for (int32_t rows : expert_rows) padded_rows += (rows + kTileM - 1) / kTileM * kTileM;
            PassShape shape{kTileM, kTileM * minibatch_tiles, ring_slots, lookahead, 512, 384, 256};
            // The FP8 table itself (one height; its gate/up blocks in either
            // order), then the two-height one.
            check_table_order(pass_geometry<ForwardFp8Pass>(shape, tokens, padded_rows));
            PassShape n_major = shape;
            n_major.n_major_kinds = 1u << ForwardFp8Pass::kGateUp;
            check_table_order(pass_geometry<ForwardFp8Pass>(n_major, tokens, padded_rows));
            shape.token_tile_m = 2 * kTileM;
            const PassGeometry<SplitNFp8Pass> g = pass_geometry<SplitNFp8Pass>(shape, tokens, padded_rows);
            SCOPED_TRACE(testing::Message() << "minibatch_tiles=" << minibatch_tiles << " slots=" << ring_slots
                                            << " lookahead=" << lookahead << " experts=" << expert_rows.size()
                                            << " m_tiles=" << g.m_tiles() << " tokens=" << tokens);
            EXPECT_EQ(g.token_m_tiles, (tokens + 2 * kTileM - 1) / (2 * kTileM));
            EXPECT_EQ(g.n_tiles[ForwardFp8Pass::kGateUp], 3);        // I 384 / 128 h columns
            EXPECT_EQ(g.n_tiles[ForwardFp8Pass::kDown], 2);          // H 512 / 256
            EXPECT_EQ(g.n_tiles[ForwardFp8Pass::kSharedGateUp], 4);  // S 256 / 64
            EXPECT_EQ(g.n_tiles[ForwardFp8Pass::kSharedDown], 4);    // H 512 / 128
            check_table_order(g);
          }
        }
      }
    }
  }
}

// The backward's table (docs/backward-design.md; the fused backward kernel
// runs it): the same check, with per-expert counters whose targets come from
// the schedule (uneven experts, an empty one) and the finale of
// weight-gradient tiles. Its recompute-mode table too.
template <class P>
void check_backward_order() {
  for (int minibatch_tiles : {1, 2, 3}) {
    for (int lookahead : {1, 2}) {
      for (const std::vector<int32_t>& expert_m_tiles :
           {std::vector<int32_t>{2, 0, 3}, std::vector<int32_t>{1}, std::vector<int32_t>{0, 0}, std::vector<int32_t>{4, 1, 1, 2}}) {
        std::vector<int32_t> first{0};
        for (int32_t m : expert_m_tiles) first.push_back(first.back() + m);
        const int32_t tile_m = 8;
        PassShape shape{tile_m, tile_m * minibatch_tiles, 0, lookahead, 512, 384, 256};
        shape.local_experts = static_cast<int32_t>(expert_m_tiles.size());
        // The buffers hold the whole schedule: as many slots as minibatches.
        shape.ring_slots = std::max(1, (first.back() + minibatch_tiles - 1) / minibatch_tiles);
        const PassGeometry<P> g = pass_geometry<P>(shape, 13, first.back() * tile_m);
        SCOPED_TRACE(testing::Message() << "minibatch_tiles=" << minibatch_tiles << " lookahead=" << lookahead
                                        << " experts=" << expert_m_tiles.size() << " m_tiles=" << first.back());
        EXPECT_EQ(g.n_tiles[P::kGrad], 2);      // I 384 / 256, rounded up
        EXPECT_EQ(g.n_tiles[P::kDx], 2);        // H 512 / 256
        EXPECT_EQ(g.expert_m_tiles[P::kWeightGrad13], 6);  // 2I 768 / 128
        EXPECT_EQ(g.expert_m_tiles[P::kWeightGrad2], 4);   // H 512 / 128
        check_table_order(g, first);
      }
    }
  }
}

TEST(PassTable, BackwardTicketOrderMeetsEveryWaitWithSmallerTickets) { check_backward_order<BackwardPass>(); }

TEST(PassTable, BackwardRecomputeTicketOrderMeetsEveryWaitWithSmallerTickets) {
  check_backward_order<BackwardRecomputePass>();
  // Its recompute kinds: I 384 / 128 gate/up pairs per tile, S 256 / 128.
  PassShape shape{8, 16, 4, 2, 512, 384, 256};
  shape.local_experts = 2;
  const auto g = pass_geometry<BackwardRecomputePass>(shape, 13, 5 * 8);
  EXPECT_EQ(g.n_tiles[BackwardRecomputePass::kRecompute], 3);
  EXPECT_EQ(g.n_tiles[BackwardRecomputePass::kSharedRecompute], 2);
}

// The checks can fail: a backward whose pipeline puts dx(m) before the g(m)
// it reads, and a backward given fewer slots than its schedule needs.
struct ReorderedBackward : BackwardPass {
  static constexpr PipelineEntry kPipeline[] = {{kDx, false}, {kGrad, false}};
};

TEST(PassTable, TheOrderCheckCatchesAPipelineThatReadsAheadOfItsProducer) {
  const std::vector<int32_t> first{0, 2, 5};
  PassShape shape{8, 16, 8, 1, 512, 384, 256};
  shape.local_experts = 2;
  const auto g = pass_geometry<ReorderedBackward>(shape, 13, first.back() * 8);
  const std::vector<std::string> errors = table_order_violations(g, first);
  ASSERT_FALSE(errors.empty());
  EXPECT_NE(errors[0].find("raised by ticket"), std::string::npos) << errors[0];
  // The real table with the same geometry is clean, and with one slot for a
  // five-m-tile schedule it is refused.
  const auto good = pass_geometry<BackwardPass>(shape, 13, first.back() * 8);
  EXPECT_TRUE(table_order_violations(good, first).empty());
  shape.ring_slots = 1;
  const auto cramped = pass_geometry<BackwardPass>(shape, 13, first.back() * 8);
  EXPECT_FALSE(buffers_hold_schedule(cramped));
  EXPECT_TRUE(buffers_hold_schedule(forward_geometry(shape, 13, first.back() * 8)));  // the forward recycles
}

}  // namespace

