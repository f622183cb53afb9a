// mok_cli tune's search (tools/tune/tune_search.hpp) as the twin of
// python/mok/tune.py's search(): on Python's cost-model test it must time
// the same candidates in the same order, with the same ratios to the
// defaults, and keep the same winner (the expected walk below is what
// Python's search printed for this model); the noise margin and the budget
// act alike; the grid is python/mok/tuning_grid.txt's; the command line and
// the progress line say what they should.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "mok/error.hpp"
#include "tune/tune_args.hpp"
#include "tune/tune_key.hpp"
#include "tune/tune_progress.hpp"
#include "tune/tune_search.hpp"
#include "tune/tuning_grid.hpp"

namespace {

using mok::tune::OptionSet;

int get(const OptionSet& options, const char* name, int fallback) {
  const auto it = options.find(name);
  return it == options.end() ? fallback : it->second;
}

// python/tests/test_tune.py's _cost: a made-up pass time with its minimum at
// minibatch 3072, 5 CTAs, 3 slots, lookahead 2.
double cost(const OptionSet& o) {
  const double mb = get(o, "minibatch_rows", 2048), ctas = get(o, "comm_ctas_per_rank", 4);
  const double slots = get(o, "ring_slots", 4), look = get(o, "lookahead", 2);
  return 5.0 + 1e-7 * (mb - 3072) * (mb - 3072) + 0.1 * (ctas - 5) * (ctas - 5) + 0.03 * std::fabs(slots - 3) +
         0.05 * std::fabs(look - 2);
}

double cost_ratio(const OptionSet& a, const OptionSet& b) { return cost(a) / cost(b); }

// The grid for a layer whose rule picks 4 dispatch CTAs (the cost model's
// default), as python/tests/test_tune.py's GRID: every factor lands on a
// number the grid lists already.
const mok::tune::Grid& grid() {
  static const mok::tune::Grid resolved =
      mok::tune::resolve_grid(mok::tune::default_grid(), {{"comm_ctas_per_rank", 4}});
  return resolved;
}

TEST(TuneSearch, WalksTheCandidatesPythonsSearchWalksAndKeepsItsWinner) {
  const mok::tune::SearchResult result =
      mok::tune::search({}, grid(), cost_ratio, /*budget_s=*/30);
  // Python: [(json.dumps(m.options, sort_keys=True), m.ratio_to_default) for m in search(...).measurements]
  const std::vector<std::pair<std::string, double>> python = {
      {R"({"minibatch_rows": 512})", 1.1051609121134451},
      {R"({"minibatch_rows": 1024})", 1.0600919497791115},
      {R"({"minibatch_rows": 2048})", 1.0},
      {R"({"minibatch_rows": 3072})", 0.9799693500736295},
      {R"({"minibatch_rows": 4096})", 1.0},
      {R"({"minibatch_rows": 6144})", 1.1602451994109637},
      {R"({"minibatch_rows": 8192})", 1.4807355982328916},
      {R"({"comm_ctas_per_rank": 2, "minibatch_rows": 3072})", 1.1327910810792639},
      {R"({"comm_ctas_per_rank": 3, "minibatch_rows": 3072})", 1.0372774992007425},
      {R"({"comm_ctas_per_rank": 4, "minibatch_rows": 3072})", 0.9799693500736295},
      {R"({"comm_ctas_per_rank": 5, "minibatch_rows": 3072})", 0.9608666336979254},
      {R"({"comm_ctas_per_rank": 6, "minibatch_rows": 3072})", 0.9799693500736296},
      {R"({"comm_ctas_per_rank": 7, "minibatch_rows": 3072})", 1.0372774992007425},
      {R"({"comm_ctas_per_rank": 8, "minibatch_rows": 3072})", 1.1327910810792639},
      {R"({"comm_ctas_per_rank": 5, "minibatch_rows": 3072, "ring_slots": 2})", 0.9608666336979254},
      {R"({"comm_ctas_per_rank": 5, "minibatch_rows": 3072, "ring_slots": 3})", 0.955135818785214},
      {R"({"comm_ctas_per_rank": 5, "minibatch_rows": 3072, "ring_slots": 4})", 0.9608666336979254},
      {R"({"comm_ctas_per_rank": 5, "minibatch_rows": 3072, "ring_slots": 6})", 0.9723282635233479},
      {R"({"comm_ctas_per_rank": 5, "lookahead": 1, "minibatch_rows": 3072, "ring_slots": 3})", 0.9646871769730662},
      {R"({"comm_ctas_per_rank": 5, "lookahead": 2, "minibatch_rows": 3072, "ring_slots": 3})", 0.955135818785214},
      {R"({"comm_ctas_per_rank": 5, "lookahead": 3, "minibatch_rows": 3072, "ring_slots": 3})", 0.9646871769730662},
      {R"({"comm_ctas_per_rank": 5, "minibatch_rows": 512, "ring_slots": 3})", 1.0803273808250298},
      {R"({"comm_ctas_per_rank": 5, "minibatch_rows": 1024, "ring_slots": 3})", 1.0352584184906959},
      {R"({"comm_ctas_per_rank": 5, "minibatch_rows": 2048, "ring_slots": 3})", 0.9751664687115845},
      {R"({"comm_ctas_per_rank": 5, "minibatch_rows": 4096, "ring_slots": 3})", 0.9751664687115845},
      {R"({"comm_ctas_per_rank": 5, "minibatch_rows": 6144, "ring_slots": 3})", 1.1354116681225483},
      {R"({"comm_ctas_per_rank": 5, "minibatch_rows": 8192, "ring_slots": 3})", 1.4559020669444762},
      {R"({"comm_ctas_per_rank": 2, "minibatch_rows": 3072, "ring_slots": 3})", 1.1270602661665527},
      {R"({"comm_ctas_per_rank": 3, "minibatch_rows": 3072, "ring_slots": 3})", 1.0315466842880312},
      {R"({"comm_ctas_per_rank": 4, "minibatch_rows": 3072, "ring_slots": 3})", 0.9742385351609183},
      {R"({"comm_ctas_per_rank": 6, "minibatch_rows": 3072, "ring_slots": 3})", 0.9742385351609183},
      {R"({"comm_ctas_per_rank": 7, "minibatch_rows": 3072, "ring_slots": 3})", 1.0315466842880312},
      {R"({"comm_ctas_per_rank": 8, "minibatch_rows": 3072, "ring_slots": 3})", 1.1270602661665527},
  };
  ASSERT_EQ(result.measurements.size(), python.size());
  for (size_t i = 0; i < python.size(); ++i) {
    EXPECT_EQ(mok::tune::describe(result.measurements[i].options), python[i].first) << i;
    EXPECT_NEAR(result.measurements[i].ratio_to_default, python[i].second, 1e-15) << i;
  }
  EXPECT_EQ(result.best, (OptionSet{{"minibatch_rows", 3072}, {"comm_ctas_per_rank", 5}, {"ring_slots", 3}}));
  EXPECT_NEAR(result.speedup, 1.0469715199999998, 1e-15);
  const std::string table = mok::tune::table(result);
  EXPECT_NE(table.find("best: {\"comm_ctas_per_rank\": 5, \"minibatch_rows\": 3072, \"ring_slots\": 3} (1.047x"),
            std::string::npos)
      << table;
}

TEST(TuneSearch, GainsWithinTheNoiseMarginAreNotTaken) {
  const auto flat = [](const OptionSet& a, const OptionSet&) { return get(a, "minibatch_rows", 0) == 512 ? 0.998 : 1.0; };
  const auto result = mok::tune::search({}, grid(), flat, 30, 0.005);
  EXPECT_TRUE(result.best.empty());
  EXPECT_EQ(result.speedup, 1.0);
}

TEST(TuneSearch, TheBudgetIsHonoured) {
  int calls = 0;
  const auto count = [&](const OptionSet&, const OptionSet&) { return ++calls, 1.0; };
  EXPECT_TRUE(mok::tune::search({}, grid(), count, 0).measurements.empty());
  // A clock that moves 1 s per reading: the search stops starting candidates at the budget.
  double now = 0;
  const auto result = mok::tune::search({}, grid(), count, 5, 0.005, {}, [&] { return now += 1; });
  EXPECT_GT(result.measurements.size(), 0u);
  EXPECT_LT(result.measurements.size(), 5u);
}

TEST(TuneSearch, ProgressSeesEachCandidateBeforeAndAfterItIsTimed) {
  std::vector<std::string> lines;
  const auto record = [&](const mok::tune::SearchStep& s) { lines.push_back(mok::tune::ProgressLine::text(s, 60)); };
  mok::tune::search({}, grid(), cost_ratio, 30, 0.005, record);
  ASSERT_EQ(lines.size(), 2 * 33u);
  EXPECT_NE(lines[0].find("0 timed; {\"minibatch_rows\": 512} ...; best 1.000x {}"), std::string::npos) << lines[0];
  EXPECT_NE(lines[7].find("4 timed; {\"minibatch_rows\": 3072} -> 0.9800 of the best; best 1.020x "
                          "{\"minibatch_rows\": 3072}"),
            std::string::npos)
      << lines[7];
  EXPECT_NE(lines[0].find("/60 s"), std::string::npos);
}

TEST(TuneGrid, IsTheGridOfPythonsTuningGridFile) {
  using V = mok::tune::GridValue;
  const mok::tune::GridText expected = {
      {"minibatch_rows", {V{512}, V{1024}, V{2048}, V{3072}, V{4096}, V{6144}, V{8192}}},
      {"comm_ctas_per_rank",
       {V{2}, V{3}, V{4}, V{5}, V{6}, V{7}, V{8}, V{0, 0.5}, V{0, 0.67}, V{0, 0.8}, V{0, 1.25}, V{0, 1.5}, V{0, 2}}},
      {"ring_slots", {V{2}, V{3}, V{4}, V{6}}},
      {"lookahead", {V{1}, V{2}, V{3}}}};
  EXPECT_EQ(mok::tune::default_grid(), expected);
  const mok::tune::Grid at_four = {{"minibatch_rows", {512, 1024, 2048, 3072, 4096, 6144, 8192}},
                                   {"comm_ctas_per_rank", {2, 3, 4, 5, 6, 7, 8}},
                                   {"ring_slots", {2, 3, 4, 6}},
                                   {"lookahead", {1, 2, 3}}};
  EXPECT_EQ(grid(), at_four);
}

TEST(TuneGrid, FactorsBracketTheLibrarysValueOnAnyLayer) {
  const auto comm = [](int library) {
    return mok::tune::resolve_grid(mok::tune::default_grid(), {{"comm_ctas_per_rank", library}})[1].second;
  };
  // Qwen3-30B-A3B's 30: 15, 20.1, 24, 37.5, 45, 60 after the numbers.
  EXPECT_EQ(comm(30), (std::vector<int>{2, 3, 4, 5, 6, 7, 8, 15, 20, 24, 38, 45, 60}));
  // GLM-4.5-Air's 9: 4.5 rounds up to 5, which is listed, as are 6.03 and 7.2 rounded.
  EXPECT_EQ(comm(9), (std::vector<int>{2, 3, 4, 5, 6, 7, 8, 11, 14, 18}));
  // Mixtral's 1: every factor lands on 1 (the walk's start) or on a number.
  EXPECT_EQ(comm(1), (std::vector<int>{2, 3, 4, 5, 6, 7, 8}));
  EXPECT_THROW(mok::tune::resolve_grid(mok::tune::default_grid(), {}), mok::Error);
  // Numbers need no library value.
  EXPECT_EQ(mok::tune::resolve_grid(mok::tune::parse_grid("ring_slots 2 3\n"), {}),
            (mok::tune::Grid{{"ring_slots", {2, 3}}}));
}

TEST(TuneGrid, ABadLineIsRefusedByNumber) {
  using V = mok::tune::GridValue;
  EXPECT_EQ(mok::tune::parse_grid("# only a comment\n\nring_slots 2 3 # why\n"),
            (mok::tune::GridText{{"ring_slots", {V{2}, V{3}}}}));
  EXPECT_EQ(mok::tune::parse_grid("ring_slots x1.5\n"), (mok::tune::GridText{{"ring_slots", {V{0, 1.5}}}}));
  EXPECT_THROW(mok::tune::parse_grid("ring_slots 2 x\n"), mok::Error);
  EXPECT_THROW(mok::tune::parse_grid("ring_slots x0\n"), mok::Error);
  EXPECT_THROW(mok::tune::parse_grid("ring_slots x-1\n"), mok::Error);
  EXPECT_THROW(mok::tune::parse_grid("ring_slots 1.5\n"), mok::Error);
  EXPECT_THROW(mok::tune::parse_grid("\nring-slots 2\n"), mok::Error);
}

TEST(TuneArgs, DefaultsAreTheDimsPythonsTunerDefaultsTo) {
  const char* argv[] = {"tune"};
  const mok::tune::TuneArgs args = mok::tune::parse_tune_args(1, argv);
  const mok::LayerConfig config = mok::tune::tune_config(args);
  // python -m mok.tune: --hidden 7168 --intermediate 2048 --experts 32 --top-k 8 --shared 2048 --tokens 4096
  EXPECT_EQ(config.hidden, 7168);
  EXPECT_EQ(config.intermediate, 2048);
  EXPECT_EQ(config.num_experts, 32);
  EXPECT_EQ(config.top_k, 8);
  EXPECT_EQ(config.shared_width(), 2048);
  EXPECT_EQ(config.tokens_per_rank, std::vector<int>{4096});
  EXPECT_EQ(args.budget_s, 120);
}

TEST(TuneArgs, DimsOverrideThePreset) {
  const char* argv[] = {"tune", "--preset", "small", "--hidden", "512", "--shared", "384", "--world", "2",
                        "--tokens", "300", "--budget", "2.5", "--cache", "/tmp/x.json", "--rounds", "3"};
  const mok::tune::TuneArgs args = mok::tune::parse_tune_args(static_cast<int>(std::size(argv)), argv);
  const mok::LayerConfig config = mok::tune::tune_config(args);
  EXPECT_EQ(config.hidden, 512);
  EXPECT_EQ(config.intermediate, 128);
  EXPECT_EQ(config.shared_width(), 384);
  EXPECT_EQ(config.world_size, 2);
  EXPECT_EQ(args.budget_s, 2.5);
  EXPECT_EQ(args.cache, "/tmp/x.json");
  EXPECT_EQ(args.rounds, 3);
  const char* none[] = {"tune", "--preset", "small", "--shared", "0"};
  EXPECT_EQ(mok::tune::tune_config(mok::tune::parse_tune_args(5, none)).shared_width(), 0);
}

TEST(TuneArgs, Fp8TunesTheFp8LayerUnderItsOwnKey) {
  const char* argv[] = {"tune", "--fp8"};
  const mok::tune::TuneArgs args = mok::tune::parse_tune_args(2, argv);
  EXPECT_TRUE(args.fp8);
  const mok::LayerConfig config = mok::tune::tune_config(args);
  EXPECT_EQ(config.dtype, mok::DType::kFP8E4M3);
  const mok::tune::GpuFacts gpu{"NVIDIA H200", 132, "13.0", "13000"};
  const std::string fp8 = mok::tune::forward_key(gpu, config).id();
  const char* plain[] = {"tune"};
  const std::string bf16 = mok::tune::forward_key(gpu, mok::tune::tune_config(mok::tune::parse_tune_args(1, plain))).id();
  EXPECT_EQ(fp8, "NVIDIA H200|132|13.0|13000|7168|2048|32|8|2048|4096|1|fp8|forward");
  EXPECT_EQ(bf16, "NVIDIA H200|132|13.0|13000|7168|2048|32|8|2048|4096|1|bf16|forward");
  // (The FP8 shape rules, H a multiple of 256 and so on, are the library's:
  // the tuner's first FusedForward refuses such a layer, by name, on the GPU.)
}

TEST(TuneArgs, BadOptionsAreRefusedByName) {
  const std::vector<std::vector<const char*>> bad = {
      {"tune", "--tokens", "12abc"}, {"tune", "--budget", "-1"}, {"tune", "--rounds", "0"},
      {"tune", "--frobnicate"},      {"tune", "--world"}};
  for (const auto& argv : bad) EXPECT_THROW(mok::tune::parse_tune_args(static_cast<int>(argv.size()), argv.data()), mok::Error);
  const char* odd[] = {"tune", "--hidden", "100"};  // not a multiple of 64: the library's own check
  EXPECT_THROW(mok::tune::tune_config(mok::tune::parse_tune_args(3, odd)), mok::Error);
}

}  // namespace
