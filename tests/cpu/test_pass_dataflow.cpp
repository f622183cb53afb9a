// A threaded model of one rank's pass, driven by its table alone: dispatch
// workers, GEMM workers taking tickets ahead, and the combine, with random
// delays, waiting and signalling through the very functions of src/protocol/.
// Every buffer row remembers which row it holds (a tag) and which n-tile
// pieces of it are in; a task that reads a row too early, or a row of another
// generation, is reported. So a table whose waits do not cover what its kinds
// read fails here, whatever its ticket order -- the dataflow half of what
// test_pass_protocol.cpp checks of the order. Run on the forward's and the
// backward's tables, on the backward's recompute-mode table, and on the FP8
// forward's (no kernel yet: this is its design's check), whose own-token
// kinds run token tiles taller than its m-tile.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "pass_test_support.hpp"
#include "protocol/host_sync.hpp"
#include "protocol/pass_backward.hpp"
#include "protocol/pass_forward.hpp"
#include "protocol/pass_forward_fp8.hpp"

namespace {

using namespace mok::protocol;

constexpr int kDispatchWriter = -2;  // a tensor the dispatch writes
constexpr int kInput = -1;           // a tensor nobody in the pass writes

struct ModelOptions {
  int dispatch_workers = 2;
  int gemm_workers = 3;
  int tickets_ahead = 2;
  int delay_us = 20;
  int skip_waits_of_kind = -1;  // a planted bug: this kind's tasks never wait
  int slow_kind = -1;           // this kind's tasks take slow_ms longer (to expose a missing wait on it)
  int slow_ms = 3;
  unsigned seed = 0;            // varies the workers' random delays
  std::chrono::milliseconds timeout{10000};
};

template <class P>
class DataflowModel {
 public:
  // expert_first_m_tile: [El + 1] where each local expert's schedule m-tiles
  // start (empty for a pass without per-expert work).
  DataflowModel(const PassGeometry<P>& g, std::vector<int32_t> expert_first_m_tile, int tokens,
                const ModelOptions& options)
      : g_(g), first_(std::move(expert_first_m_tile)), tokens_(tokens), options_(options), sync_(options.timeout) {
    words_.assign(counter_words(g_), 0u);
    counters_ = carve_counters(g_, words_.data(), &abort_, &stall_);
    for (int k = 0; k < P::kNumKinds; ++k) {
      for (Tensor t : {P::kKinds[k].out, P::kKinds[k].also_out}) {
        if (t != Tensor::kNoTensor) writer_[t] = k;
      }
    }
    for (Tensor t : P::Dispatch::value.writes) {
      if (t != Tensor::kNoTensor) writer_[t] = kDispatchWriter;
    }
  }

  void run() {
    std::vector<std::thread> threads;
    for (int w = 0; w < options_.dispatch_workers; ++w) threads.emplace_back([this, w] { dispatch_worker(w); });
    for (int w = 0; w < options_.gemm_workers; ++w) threads.emplace_back([this, w] { gemm_worker(w); });
    threads.emplace_back([this] { combine(); });
    for (std::thread& t : threads) t.join();
  }

  std::vector<std::string> errors() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return errors_;
  }
  bool aborted() const { return abort_ != 0; }
  const StallReport& stall() const { return stall_; }
  bool combined() const { return combined_.load(); }

 private:
  struct Row {
    int64_t tag = -1;     // the row of its space it holds
    uint64_t pieces = 0;  // n-tiles of it that are in
  };

  int writer_of(Tensor t) const {
    const auto it = writer_.find(t);
    return it == writer_.end() ? kInput : it->second;
  }
  uint64_t full_mask(Tensor t) const {
    const int w = writer_of(t);
    const int pieces = w == kDispatchWriter ? 1 : g_.n_tiles[w];
    return pieces >= 64 ? ~0ull : (1ull << pieces) - 1;
  }
  // Where schedule row `row` sits in a buffer of schedule rows (the ring; or
  // the home rows the outputs of (token, slot) go to, or the backward's dx
  // rows, which the combine reads by schedule row: the row itself).
  static bool by_schedule_row(Tensor t) { return t == Tensor::kHomeCombine || t == Tensor::kDxRows; }
  int64_t slot_of_row(Tensor t, int64_t row) const {
    if (by_schedule_row(t)) return row;
    const int32_t m = static_cast<int32_t>(row / g_.tile_m);
    return ring_row_of_tile(g_, m) + row % g_.tile_m;
  }
  ExpertOfWork expert_of(int32_t kind, int32_t m_tile) const {
    return test_support::expert_of_work(g_, first_, kind, m_tile);
  }

  void fail(const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (errors_.size() < 20) errors_.push_back(message);
  }
  void delay(std::mt19937& rng) {
    if (options_.delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % options_.delay_us));
  }

  void write(Tensor t, int64_t slot, int64_t tag, int piece) {
    if (t == Tensor::kNoTensor) return;
    std::lock_guard<std::mutex> lock(mutex_);
    Row& r = buffers_[t][slot];
    if (r.tag != tag) r = Row{tag, 0};
    r.pieces |= 1ull << piece;
  }
  void expect_complete(Tensor t, int64_t slot, int64_t tag, const std::string& who) {
    if (writer_of(t) == kInput) return;
    Row r;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto& buffer = buffers_[t];
      const auto it = buffer.find(slot);
      if (it != buffer.end()) r = it->second;
    }
    if (r.tag != tag || (r.pieces & full_mask(t)) != full_mask(t)) {
      fail(who + " read tensor " + std::to_string(static_cast<int>(t)) + " row " + std::to_string(tag) +
           " before it was complete (holds row " + std::to_string(r.tag) + ", pieces " + std::to_string(r.pieces) +
           ")");
    }
  }

  // Dispatch worker w: m-tiles w, w + workers, ... in order.
  void dispatch_worker(int w) {
    std::mt19937 rng(static_cast<unsigned>(100 + w) + options_.seed * 1000u);
    for (int32_t m = w; m < g_.m_tiles(); m += options_.dispatch_workers) {
      const int32_t mb = m / g_.tiles_per_minibatch();
      const ExpertOfWork of = expert_of(schedule_kind(), m);
      if (!wait_inputs<typename P::Dispatch>(sync_, counters_, g_, mb, m, 0, of)) return;
      delay(rng);
      for (Tensor t : P::Dispatch::value.writes) {
        for (int i = 0; i < g_.tile_m; ++i) {
          const int64_t row = static_cast<int64_t>(m) * g_.tile_m + i;
          write(t, slot_of_row(t, row), row, 0);
        }
      }
      signal_outputs<typename P::Dispatch>(sync_, counters_, g_, mb, m, of);
    }
  }

  static constexpr int32_t schedule_kind() { return test_support::first_schedule_kind<P>(); }

  void gemm_worker(int w) {
    std::mt19937 rng(static_cast<unsigned>(500 + w) + options_.seed * 1000u);
    std::deque<int64_t> held;
    for (int i = 0; i <= options_.tickets_ahead; ++i) held.push_back(take_ticket(sync_, counters_));
    for (;;) {
      const int64_t ticket = held.front();
      held.pop_front();
      if (ticket >= task_count(g_)) return;
      held.push_back(take_ticket(sync_, counters_));
      const Task t = decode_task(g_, ticket);
      const ExpertOfWork of = expert_of(t.kind, t.m_tile);
      bool ok = true;
      visit_kind<P>(t.kind, [&](auto K) {
        using Spec = KindSpec<P, index_of<decltype(K)>>;
        if (t.kind != options_.skip_waits_of_kind) ok = wait_inputs<Spec>(sync_, counters_, g_, t.minibatch, t.m_tile, 0, of);
        if (!ok) return;
        delay(rng);
        if (t.kind == options_.slow_kind) std::this_thread::sleep_for(std::chrono::milliseconds(options_.slow_ms));
        run_task(t, of, "ticket " + std::to_string(ticket));
        signal_outputs<Spec>(sync_, counters_, g_, t.minibatch, t.m_tile, of);
      });
      if (!ok) return;
    }
  }

  void run_task(const Task& t, const ExpertOfWork& of, const std::string& who) {
    const TaskKindSpec& spec = P::kKinds[t.kind];
    if (spec.rows == Rows::kExpert) {
      // Reads every row of its expert, both operands; writes one tile.
      for (int32_t m = first_[of.expert]; m < first_[of.expert + 1]; ++m) {
        for (int i = 0; i < g_.tile_m; ++i) {
          const int64_t row = static_cast<int64_t>(m) * g_.tile_m + i;
          for (Tensor operand : {spec.a, spec.b}) expect_complete(operand, slot_of_row(operand, row), row, who);
        }
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (!tiles_.insert({t.kind, t.m_tile, t.n_tile}).second) errors_.push_back(who + " wrote its tile twice");
      return;
    }
    if (spec.rows == Rows::kTokenReduce) {
      // Reads every token row of both operands; writes one tile.
      for (int64_t row = 0; row < tokens_; ++row) {
        for (Tensor operand : {spec.a, spec.b}) expect_complete(operand, row, row, who);
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (!tiles_.insert({t.kind, t.m_tile, t.n_tile}).second) errors_.push_back(who + " wrote its tile twice");
      return;
    }
    // An m-tile of schedule rows, or a token tile.
    const int32_t height = spec.rows == Rows::kTokens ? g_.token_tile_m : g_.tile_m;
    for (int i = 0; i < height; ++i) {
      const int64_t row = static_cast<int64_t>(t.m_tile) * height + i;
      if (spec.rows == Rows::kTokens) {
        if (row >= tokens_) break;
        expect_complete(spec.a, row, row, who);
        if (spec.also_in != Tensor::kNoTensor) expect_complete(spec.also_in, row, row, who + " (epilogue)");
        for (Tensor out : {spec.out, spec.also_out}) write(out, row, row, t.n_tile);
      } else {
        expect_complete(spec.a, slot_of_row(spec.a, row), row, who);
        if (spec.also_in != Tensor::kNoTensor) {
          expect_complete(spec.also_in, slot_of_row(spec.also_in, row), row, who + " (epilogue)");
        }
        for (Tensor out : {spec.out, spec.also_out}) {
          if (out != Tensor::kNoTensor) write(out, slot_of_row(out, row), row, t.n_tile);
        }
      }
    }
  }

  void combine() {
    for (const CounterWait& w : P::Combine::value.waits) {
      if (w.counter != kNoCounter && !wait_counter(sync_, counters_.abort_view(), counters_, g_, w, 0, 0, 0, 0)) {
        return;
      }
    }
    for (Tensor t : P::Combine::value.reads) {
      if (t == Tensor::kNoTensor || writer_of(t) == kInput) continue;
      const bool schedule_rows = by_schedule_row(t);
      const int64_t rows = schedule_rows ? g_.padded_rows : tokens_;
      for (int64_t r = 0; r < rows; ++r) expect_complete(t, r, r, "the combine");
    }
    combined_.store(true);
  }

  PassGeometry<P> g_;
  std::vector<int32_t> first_;
  int tokens_;
  ModelOptions options_;
  HostSync sync_;
  std::vector<uint32_t> words_;
  PassCounters<P> counters_{};
  uint32_t abort_ = 0;
  StallReport stall_{};
  std::map<Tensor, int> writer_;
  mutable std::mutex mutex_;
  std::map<Tensor, std::map<int64_t, Row>> buffers_;
  std::set<std::tuple<int, int, int>> tiles_;
  std::vector<std::string> errors_;
  std::atomic<bool> combined_{false};
};

template <class P>
void run_clean(const PassGeometry<P>& g, const std::vector<int32_t>& first, int tokens, const ModelOptions& o) {
  DataflowModel<P> model(g, first, tokens, o);
  model.run();
  for (const std::string& e : model.errors()) ADD_FAILURE() << e;
  ASSERT_FALSE(model.aborted()) << "stalled on counter " << model.stall().counter << " index "
                                << model.stall().index << " target " << model.stall().target << " observed "
                                << model.stall().observed;
  EXPECT_TRUE(model.combined());
}

ForwardGeometry forward_geometry_for(int minibatch_tiles, int ring_slots, int lookahead, int tokens, int m_tiles) {
  // H 512 and S 256: two n-tiles each for down and shared gate/up; I 256: two
  // gate/up n-tiles. tile_m 4 keeps the model small.
  return forward_geometry(PassShape{4, 4 * minibatch_tiles, ring_slots, lookahead, 512, 256, 256}, tokens,
                          m_tiles * 4);
}

ForwardFp8Geometry fp8_geometry_for(int minibatch_tiles, int ring_slots, int lookahead, int tokens, int m_tiles) {
  // The FP8 forward with an m-tile of 4 rows and token tiles of 8 (64 and 128
  // in the kernel). I 256: two gate/up n-tiles of 128 h columns; H 512: two
  // down n-tiles, four shared down ones (128 x 128 tiles); S 256: four shared
  // gate/up n-tiles of 64 columns.
  PassShape shape{4, 4 * minibatch_tiles, ring_slots, lookahead, 512, 256, 256};
  shape.token_tile_m = 8;
  return pass_geometry<ForwardFp8Pass>(shape, tokens, m_tiles * 4);
}

template <class P = BackwardPass>
PassGeometry<P> backward_geometry_for(int minibatch_tiles, int lookahead, int tokens,
                                      const std::vector<int32_t>& first) {
  PassShape shape{4, 4 * minibatch_tiles, 1, lookahead, 512, 384, 256};
  shape.local_experts = static_cast<int32_t>(first.size()) - 1;
  // The backward's buffers hold the whole schedule: a slot per minibatch.
  shape.ring_slots = std::max(1, (first.back() + minibatch_tiles - 1) / minibatch_tiles);
  return pass_geometry<P>(shape, tokens, first.back() * 4);
}

TEST(PassDataflow, TheForwardTableReadsOnlyCompleteRows) {
  for (int ring_slots : {1, 2, 3}) {
    for (int lookahead : {1, 2}) {
      for (int minibatch_tiles : {1, 2}) {
        SCOPED_TRACE(testing::Message() << "slots=" << ring_slots << " lookahead=" << lookahead
                                        << " minibatch_tiles=" << minibatch_tiles);
        run_clean(forward_geometry_for(minibatch_tiles, ring_slots, lookahead, 13, 9), {}, 13, ModelOptions{});
      }
    }
  }
}

// Tokens: a partial last token tile (13), whole ones (16), fewer than one (3).
TEST(PassDataflow, TheFp8ForwardTableReadsOnlyCompleteRows) {
  for (int ring_slots : {1, 2, 3}) {
    for (int lookahead : {1, 2}) {
      for (int minibatch_tiles : {1, 2}) {
        for (int tokens : {13, 16, 3}) {
          SCOPED_TRACE(testing::Message() << "slots=" << ring_slots << " lookahead=" << lookahead
                                          << " minibatch_tiles=" << minibatch_tiles << " tokens=" << tokens);
          const ForwardFp8Geometry g = fp8_geometry_for(minibatch_tiles, ring_slots, lookahead, tokens, 9);
          ASSERT_EQ(g.token_m_tiles, (tokens + 7) / 8);
          run_clean(g, {}, tokens, ModelOptions{});
        }
      }
    }
  }
}

TEST(PassDataflow, TheBackwardTableReadsOnlyCompleteRows) {
  for (int lookahead : {1, 2}) {
    for (int minibatch_tiles : {1, 3}) {
      for (const std::vector<int32_t>& first : {std::vector<int32_t>{0, 2, 2, 5}, std::vector<int32_t>{0, 4},
                                                std::vector<int32_t>{0, 1, 3, 4, 7}}) {
        SCOPED_TRACE(testing::Message() << "lookahead=" << lookahead << " minibatch_tiles=" << minibatch_tiles
                                        << " experts=" << first.size() - 1);
        run_clean(backward_geometry_for(minibatch_tiles, lookahead, 10, first), first, 10, ModelOptions{});
      }
    }
  }
}

// Recompute mode (BackwardMode::kRecompute): the g tasks' epilogue reads the
// pre-activations the recompute tasks wrote (TaskKindSpec::also_in).
TEST(PassDataflow, TheBackwardRecomputeTableReadsOnlyCompleteRows) {
  for (int lookahead : {1, 2}) {
    for (int minibatch_tiles : {1, 3}) {
      for (const std::vector<int32_t>& first : {std::vector<int32_t>{0, 2, 2, 5}, std::vector<int32_t>{0, 1, 3, 4, 7}}) {
        SCOPED_TRACE(testing::Message() << "lookahead=" << lookahead << " minibatch_tiles=" << minibatch_tiles
                                        << " experts=" << first.size() - 1);
        run_clean(backward_geometry_for<BackwardRecomputePass>(minibatch_tiles, lookahead, 10, first), first, 10,
                  ModelOptions{});
      }
    }
  }
}

// Planted bugs: a kind that does not wait reads rows before they are
// complete, and the model says so (so the clean runs above are evidence).
// A missing wait shows only when the reader overtakes its producer, which
// threads do not promise on a loaded machine (CI runs tests in parallel): the
// producer kind is made slow and the model is run again, with other delays,
// until the reader overtakes (almost always the first run). The number of
// runs is bounded; a correct table never reports an error in any of them
// (the tests above).
template <class P>
int runs_until_caught(const PassGeometry<P>& g, const std::vector<int32_t>& first, int tokens, ModelOptions o) {
  constexpr int kMostRuns = 16;
  for (int run = 1; run <= kMostRuns; ++run) {
    o.seed = static_cast<unsigned>(run);
    DataflowModel<P> model(g, first, tokens, o);
    model.run();
    if (!model.errors().empty()) return run;
  }
  return 0;
}

TEST(PassDataflow, AKindThatSkipsItsWaitsIsCaught) {
  ModelOptions o;
  o.gemm_workers = 4;
  o.dispatch_workers = 1;
  o.delay_us = 300;
  o.slow_ms = 5;
  {
    o.skip_waits_of_kind = ForwardPass::kDown;
    o.slow_kind = ForwardPass::kGateUp;  // so that a down task can overtake the h it reads
    EXPECT_GT(runs_until_caught(forward_geometry_for(1, 2, 1, 13, 9), {}, 13, o), 0)
        << "forward: down tasks reading h without waiting went unnoticed";
  }
  {
    o.skip_waits_of_kind = ForwardFp8Pass::kDown;
    o.slow_kind = ForwardFp8Pass::kGateUp;
    EXPECT_GT(runs_until_caught(fp8_geometry_for(1, 2, 1, 13, 9), {}, 13, o), 0)
        << "FP8 forward: down tasks reading h without waiting went unnoticed";
  }
  {
    // A token-tile wait: shared down tasks that skip shared_h_ready read the
    // shared h rows of their token tile before the shared gate/up tasks wrote them.
    o.skip_waits_of_kind = ForwardFp8Pass::kSharedDown;
    o.slow_kind = ForwardFp8Pass::kSharedGateUp;
    EXPECT_GT(runs_until_caught(fp8_geometry_for(1, 2, 1, 13, 9), {}, 13, o), 0)
        << "FP8 forward: shared down tasks reading shared h without waiting went unnoticed";
  }
  {
    o.skip_waits_of_kind = BackwardPass::kWeightGrad13;
    o.slow_kind = BackwardPass::kGrad;  // so that a dW13 tile can overtake the rows it reads
    const std::vector<int32_t> first{0, 3, 5};
    EXPECT_GT(runs_until_caught(backward_geometry_for(1, 1, 10, first), first, 10, o), 0)
        << "backward: dW13 tiles reading d13 and x without waiting went unnoticed";
  }
  {
    // The shared dW13 tiles' tickets come after every other kind's: enough
    // workers that some hold them while the (slow) shared g tasks run.
    ModelOptions wide = o;
    wide.gemm_workers = 16;
    wide.skip_waits_of_kind = BackwardPass::kSharedWeightGrad13;
    wide.slow_kind = BackwardPass::kSharedGrad;
    const std::vector<int32_t> first{0, 1};
    EXPECT_GT(runs_until_caught(backward_geometry_for(1, 1, 10, first), first, 10, wide), 0)
        << "backward: shared dW13 tiles reading the shared d13 without waiting went unnoticed";
  }
  {
    // Recompute mode: g tasks that do not wait read pre-activations the
    // recompute tasks have not stored -- an epilogue input (also_in), which
    // the model checks too: at least one run must report exactly that.
    o.skip_waits_of_kind = BackwardRecomputePass::kGrad;
    o.slow_kind = BackwardRecomputePass::kRecompute;
    const std::vector<int32_t> first{0, 3, 5};
    const auto g = backward_geometry_for<BackwardRecomputePass>(1, 1, 10, first);
    bool epilogue_caught = false;
    for (int run = 1; run <= 16 && !epilogue_caught; ++run) {
      o.seed = static_cast<unsigned>(run);
      DataflowModel<BackwardRecomputePass> model(g, first, 10, o);
      model.run();
      for (const std::string& e : model.errors()) epilogue_caught = epilogue_caught || e.find("(epilogue)") != std::string::npos;
    }
    EXPECT_TRUE(epilogue_caught) << "recompute: g tasks reading unrecomputed pre-activations went unnoticed";
  }
}

}  // namespace
