// The fused forward megakernel (virtual world) against the CPU reference, and
// its determinism: bitwise identical across runs, world sizes, minibatch and
// ring sizes, and SM splits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu_test_env.hpp"
#include "mok/bf16.hpp"
#include "mok/device_layer.hpp"
#include "mok/error.hpp"
#include "mok/fused_forward.hpp"
#include "mok/presets.hpp"
#include "mok/reference.hpp"
#include "mok/schedule.hpp"
#include "mok/synthetic.hpp"
#include "world/fused_kernel.hpp"
#include "world/workspace_layout.hpp"

namespace {

using mok::synthetic::RoutingMode;

using mok::DeviceLayer;

std::vector<uint16_t> run_fused(DeviceLayer& device, const mok::LayerConfig& config,
                                const mok::FusedForwardOptions& options) {
  mok::FusedForward forward(config, options);
  device.poison_outputs();
  forward.run(device.tensors());
  forward.check();
  return device.download_outputs();
}

std::vector<double> reference_out(const mok::synthetic::Layer& layer) {
  const auto routing = layer.routing();
  const auto schedule = mok::build_schedule(layer.config, routing, {128, 1});
  mok::ReferenceOptions options;
  options.num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto forward = mok::reference_forward(layer.inputs(), schedule, options);
  std::vector<double> all;
  for (const auto& rank : forward.out) all.insert(all.end(), rank.begin(), rank.end());
  return all;
}

void expect_close_to_reference(const std::vector<uint16_t>& out, const std::vector<double>& ref) {
  ASSERT_EQ(out.size(), ref.size());
  double worst = 0;
  size_t bad = 0, worst_at = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double got = mok::bf16_bits_to_float(out[i]);
    const double diff = std::fabs(got - ref[i]);
    if (!(diff <= 0.02 + 0.02 * std::fabs(ref[i]))) ++bad;  // also counts NaN (unwritten)
    if (!(diff <= worst)) { worst = diff; worst_at = i; }
  }
  EXPECT_EQ(bad, 0u) << "worst element " << worst_at << ": got " << mok::bf16_bits_to_float(out[worst_at])
                     << " want " << ref[worst_at];
  EXPECT_LT(mok::relative_l2_error(out, {ref}), 1e-2);
}

mok::FusedForwardOptions small_ring(int minibatch_rows, int ring_slots) {
  mok::FusedForwardOptions o;
  o.minibatch_rows = minibatch_rows;
  o.ring_slots = ring_slots;
  o.timeout_seconds = 5;
  return o;
}

TEST(FusedForward, MatchesTheReferenceOnSeveralPresetsAndWorlds) {
  MOK_REQUIRE_HOPPER();
  struct Case { const char* preset; int world; int tokens; };
  for (const Case& c : {Case{"small", 1, 300}, Case{"small", 2, 200}, Case{"small", 4, 97}, Case{"small", 8, 64},
                        Case{"no-shared", 2, 150}, Case{"medium", 4, 96}}) {
    SCOPED_TRACE(testing::Message() << c.preset << " R=" << c.world << " T=" << c.tokens);
    const auto config = mok::make_config(mok::find_shape(c.preset), c.world, c.tokens);
    const auto layer = mok::synthetic::make_layer(config, 17);
    DeviceLayer device(layer);
    expect_close_to_reference(run_fused(device, config, small_ring(256, 2)), reference_out(layer));
  }
}

TEST(FusedForward, RingFarSmallerThanOneExpertsRowsAndExtremeImbalance) {
  MOK_REQUIRE_HOPPER();
  // Every token on experts 0..k-1: rank 0 receives everything, through a ring
  // of one 128-row slot.
  const auto config = mok::make_config(mok::find_shape("small"), 2, 700);
  const auto layer = mok::synthetic::make_layer(config, 3, RoutingMode::kSameExperts);
  DeviceLayer device(layer);
  expect_close_to_reference(run_fused(device, config, small_ring(128, 1)), reference_out(layer));
}

TEST(FusedForward, UnequalTokenCountsIncludingZeroAndOne) {
  MOK_REQUIRE_HOPPER();
  const auto config = mok::make_config(mok::find_shape("small"), std::vector<int>{0, 1, 250, 33});
  const auto layer = mok::synthetic::make_layer(config, 5, RoutingMode::kSkewed);
  DeviceLayer device(layer);
  expect_close_to_reference(run_fused(device, config, small_ring(256, 3)), reference_out(layer));
}

// An object made for a capacity runs passes with fewer tokens per rank
// (RankTensors::tokens): the bits of an object made for exactly those counts,
// pass after pass as the counts change, with nothing reallocated.
TEST(FusedForward, ACapacityObjectGivesTheExactObjectsBitsAsTokenCountsChange) {
  MOK_REQUIRE_HOPPER();
  const auto capacity = mok::make_config(mok::find_shape("small"), std::vector<int>{40, 7, 300, 300});
  mok::FusedForward sized_for_capacity(capacity, small_ring(256, 2));
  for (const std::vector<int>& counts : {std::vector<int>{0, 1, 250, 33}, std::vector<int>{40, 7, 300, 300},
                                         std::vector<int>{13, 0, 2, 299}}) {
    SCOPED_TRACE(testing::Message() << "counts " << counts[0] << " " << counts[1] << " " << counts[2] << " "
                                    << counts[3]);
    const auto exact = mok::make_config(mok::find_shape("small"), counts);
    const auto layer = mok::synthetic::make_layer(exact, 31, RoutingMode::kSkewed);
    DeviceLayer device(layer);
    const std::vector<uint16_t> want = run_fused(device, exact, small_ring(256, 2));
    std::vector<mok::RankTensors> tensors = device.tensors();
    for (size_t r = 0; r < tensors.size(); ++r) tensors[r].tokens = counts[r];
    device.poison_outputs();
    sized_for_capacity.run(tensors);
    sized_for_capacity.check();
    EXPECT_EQ(device.download_outputs(), want);
  }
  // More tokens than the capacity is refused before any launch.
  const auto config = mok::make_config(mok::find_shape("small"), std::vector<int>{40, 7, 300, 300});
  const auto layer = mok::synthetic::make_layer(config, 32);
  DeviceLayer device(layer);
  std::vector<mok::RankTensors> tensors = device.tensors();
  tensors[1].tokens = 8;
  EXPECT_THROW(sized_for_capacity.run(tensors), mok::Error);
  // Device-ordered passes run at capacity only (they clear their counters by
  // their own counts).
  mok::FusedForwardOptions ordered = small_ring(256, 2);
  ordered.device_ordered = true;
  mok::FusedForward device_ordered(config, ordered);
  tensors[1].tokens = 3;
  EXPECT_THROW(device_ordered.run(tensors), mok::Error);
}

TEST(FusedForward, BitwiseIdenticalOverTwentyRuns) {
  MOK_REQUIRE_HOPPER();
  const auto config = mok::make_config(mok::find_shape("medium"), 4, 128);
  const auto layer = mok::synthetic::make_layer(config, 9, RoutingMode::kSkewed);
  DeviceLayer device(layer);
  mok::FusedForward forward(config, small_ring(256, 2));
  std::vector<uint16_t> first;
  for (int run = 0; run < 20; ++run) {
    device.poison_outputs();
    forward.run(device.tensors());
    forward.check();
    const auto out = device.download_outputs();
    if (run == 0) first = out;
    ASSERT_EQ(out, first) << "run " << run;
  }
}

TEST(FusedForward, BitwiseIdenticalAcrossWorldSizesRingsMinibatchesAndSmSplits) {
  MOK_REQUIRE_HOPPER();
  // One global batch of 256 tokens, split over R ranks: the concatenated
  // output must not change by a single bit.
  const int global_tokens = 256;
  std::vector<uint16_t> baseline;
  struct Case { int world; int minibatch; int slots; int ctas; int comm; };
  for (const Case& c : {Case{1, 1024, 4, 0, 0}, Case{1, 128, 1, 20, 3}, Case{2, 256, 2, 0, 0},
                        Case{4, 128, 3, 16, 1}, Case{8, 384, 1, 0, 0}, Case{8, 128, 2, 8, 2}}) {
    SCOPED_TRACE(testing::Message() << "R=" << c.world << " minibatch=" << c.minibatch << " slots=" << c.slots
                                    << " ctas=" << c.ctas << " comm=" << c.comm);
    const auto config = mok::make_config(mok::find_shape("medium"), c.world, global_tokens / c.world);
    const auto layer = mok::synthetic::make_layer(config, 21);
    DeviceLayer device(layer);
    mok::FusedForwardOptions o = small_ring(c.minibatch, c.slots);
    o.ctas_per_rank = c.ctas;
    o.comm_ctas_per_rank = c.comm;
    const auto out = run_fused(device, config, o);
    if (baseline.empty()) {
      baseline = out;
      expect_close_to_reference(out, reference_out(layer));
    } else {
      ASSERT_EQ(out, baseline);
    }
  }
}

TEST(FusedForward, TracingRecordsEveryTaskAndLeavesTheOutputBitwiseUnchanged) {
  MOK_REQUIRE_HOPPER();
  const mok::LayerConfig config = mok::make_config(mok::find_shape("small"), 2, 200);
  const auto layer = mok::synthetic::make_layer(config, 17, RoutingMode::kUniform);
  DeviceLayer device(layer);
  mok::FusedForwardOptions plain = small_ring(256, 2);
  const std::vector<uint16_t> want = run_fused(device, config, plain);

  mok::FusedForwardOptions traced_options = plain;
  traced_options.trace_events = 1 << 16;
  mok::FusedForward traced(config, traced_options);
  for (int pass = 0; pass < 2; ++pass) {  // the second pass's trace starts from zero again
    device.poison_outputs();
    traced.run(device.tensors());
    const std::vector<mok::TraceEvent> events = traced.trace();
    EXPECT_EQ(device.download_outputs(), want) << "pass " << pass;

    // Every GEMM task of every rank: one task wait, mainloop, epilogue, handoff and signal.
    const auto schedule = mok::build_schedule(config, layer.routing(), {128, 1});
    int64_t tasks = 0, m_tiles = 0;
    for (const auto& rank : schedule.ranks) {
      const int64_t tiles = rank.padded_rows() / 128;
      const int64_t shared_tiles = (config.tokens_per_rank[rank.rank] + 127) / 128;
      m_tiles += tiles;
      const int64_t down_n = (config.hidden + 255) / 256;
      tasks += tiles * ((config.intermediate + 127) / 128 + down_n) +
               shared_tiles * ((config.shared_width() + 127) / 128 + down_n);
    }
    int64_t waits = 0, mainloops = 0, epilogues = 0, handoffs = 0, signals = 0, copies = 0;
    for (const mok::TraceEvent& e : events) {
      EXPECT_LE(e.begin_ns, e.end_ns);
      EXPECT_LT(e.rank, config.world_size);
      const auto kind = static_cast<mok::TraceKind>(e.kind);
      // A mainloop is long enough for both clocks to move; its cycles over
      // its nanoseconds is the SM clock, within what any Hopper part runs at.
      if (kind == mok::TraceKind::kMainloop && e.end_ns - e.begin_ns >= 2000) {
        const double ghz = static_cast<double>(e.cycles) / static_cast<double>(e.end_ns - e.begin_ns);
        EXPECT_GT(ghz, 0.2);
        EXPECT_LT(ghz, 2.5);
      }
      waits += kind == mok::TraceKind::kTaskWait;
      mainloops += kind == mok::TraceKind::kMainloop;
      epilogues += kind == mok::TraceKind::kEpilogue;
      signals += kind == mok::TraceKind::kSignal;
      handoffs += kind == mok::TraceKind::kHandoff;
      copies += kind == mok::TraceKind::kDispatchCopy;
    }
    EXPECT_EQ(waits, tasks);
    EXPECT_EQ(mainloops, tasks);
    EXPECT_EQ(epilogues, tasks);
    EXPECT_EQ(handoffs, tasks);
    EXPECT_EQ(signals, tasks);
    EXPECT_EQ(copies, m_tiles);  // one per m-tile of every rank
    const mok::TraceSummary summary = mok::summarize_trace(events);
    EXPECT_GT(summary.span_us, 0);
    EXPECT_NEAR(summary.mainloop_share + summary.epilogue_share + summary.head_share + summary.gap_share +
                    summary.tail_share,
                1.0, 1e-9);
  }
  mok::FusedForwardOptions tiny = plain;
  tiny.trace_events = 3;
  mok::FusedForward overflowing(config, tiny);
  overflowing.run(device.tensors());
  EXPECT_THROW(overflowing.trace(), mok::Error);
  mok::FusedForward untraced(config, plain);
  EXPECT_THROW(untraced.trace(), mok::Error);
}

TEST(FusedForward, RejectsBadInputBeforeLaunch) {
  MOK_REQUIRE_HOPPER();
  const auto config = mok::make_config(mok::find_shape("small"), 2, 16);
  auto bad = small_ring(100, 1);
  EXPECT_THROW(mok::FusedForward(config, bad), mok::Error);  // minibatch not a multiple of 128
  bad = small_ring(128, 0);
  EXPECT_THROW(mok::FusedForward(config, bad), mok::Error);
  bad = small_ring(128, 1);
  bad.ctas_per_rank = 1000;
  EXPECT_THROW(mok::FusedForward(config, bad), mok::Error);
  // An fp8 layer must have H a multiple of 256 (its down tiles' width;
  // test_fused_forward_fp8.cpp checks the rest of its rules).
  auto fp8 = mok::make_config(mok::find_shape("small"), 2, 16);
  fp8.dtype = mok::DType::kFP8E4M3;
  fp8.hidden = 384;
  EXPECT_THROW(mok::FusedForward(fp8, small_ring(128, 1)), mok::Error);
  // Tickets are decoded in 32 bits: a shape whose schedule could reach 2^31
  // GEMM tasks is refused up front, for that reason, before the workspace is
  // allocated. Within the layer's own limit (tokens x top_k < 2^30 rows) that
  // takes wide tiles: H 8192 and I 32768 give 32 + 256 n-tiles per m-tile,
  // and 1.024e9 rows make 8e6 m-tiles, 2.3e9 tasks.
  const mok::LayerShape wide{"wide", 8192, 32768, 8, 8, 0, "test: over the task bound"};
  try {
    mok::FusedForward huge(mok::make_config(wide, 1, 128'000'000), {});
    ADD_FAILURE() << "a pass of more than 2^31 GEMM tasks was accepted";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("2^31"), std::string::npos) << e.what();
  }

  const auto layer = mok::synthetic::make_layer(config, 1);
  DeviceLayer device(layer);
  mok::FusedForward forward(config, small_ring(128, 1));
  auto tensors = device.tensors();
  tensors[1].x = nullptr;
  EXPECT_THROW(forward.run(tensors), mok::Error);
  tensors = device.tensors();
  tensors[0].w2 = static_cast<const uint8_t*>(tensors[0].w2) + 2;  // misaligned
  EXPECT_THROW(forward.run(tensors), mok::Error);
  tensors = device.tensors();
  tensors.pop_back();
  EXPECT_THROW(forward.run(tensors), mok::Error);
}

// A pass over `layer` must end in a mok::Error whose text holds every one of `says`.
void expect_pass_refused(mok::FusedForward& forward, const mok::synthetic::Layer& layer,
                         std::initializer_list<const char*> says) {
  DeviceLayer device(layer);
  forward.run(device.tensors());
  try {
    forward.check();
    ADD_FAILURE() << "no error for " << *says.begin();
  } catch (const mok::Error& e) {
    for (const char* part : says) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// After a refused pass, the same object runs a good batch, right.
void expect_next_pass_right(mok::FusedForward& forward, const mok::synthetic::Layer& layer) {
  DeviceLayer good(layer);
  good.poison_outputs();
  forward.run(good.tensors());
  EXPECT_NO_THROW(forward.check());
  expect_close_to_reference(good.download_outputs(), reference_out(layer));
}

TEST(FusedForward, BadExpertIdsAreErrorsNamingRankTokenAndSlot) {
  MOK_REQUIRE_HOPPER();
  const auto config = mok::make_config(mok::find_shape("small"), 2, 16);
  mok::FusedForward forward(config, small_ring(128, 1));
  // Bad entries at several tokens, so that the warp that finds them differs
  // (a role that left its peers at a barrier would hang here), out of range
  // and repeated within a token.
  struct Bad { int token; int slot; int id; const char* says; };
  for (const Bad& bad : {Bad{0, 0, 8, "rank 1, token 0, slot 0: expert id 8"},
                         Bad{1, 1, -1, "rank 1, token 1, slot 1: expert id -1"},
                         Bad{3, 1, 99, "rank 1, token 3, slot 1: expert id 99"},
                         Bad{5, 1, 8, "rank 1, token 5, slot 1: expert id 8"},
                         Bad{2, 1, -2, "rank 1, token 2, slot 1: expert id"}}) {
    auto layer = mok::synthetic::make_layer(config, 2);
    auto& ids = layer.expert_ids[1];
    // id -2 stands for "repeat slot 0's expert".
    ids[bad.token * config.top_k + bad.slot] = bad.id == -2 ? ids[bad.token * config.top_k] : bad.id;
    expect_pass_refused(forward, layer, {bad.says});
  }
  expect_next_pass_right(forward, mok::synthetic::make_layer(config, 2));
}

TEST(FusedForward, NonFiniteRoutingWeightsAreErrorsNamingRankTokenAndSlot) {
  MOK_REQUIRE_HOPPER();
  const auto config = mok::make_config(mok::find_shape("small"), 2, 16);
  mok::FusedForward forward(config, small_ring(128, 1));
  struct Bad { int rank; int token; int slot; float weight; const char* says; };
  const float inf = std::numeric_limits<float>::infinity();
  for (const Bad& bad : {Bad{0, 0, 0, std::nanf(""), "rank 0, token 0, slot 0: routing weight"},
                         Bad{1, 7, 1, inf, "rank 1, token 7, slot 1: routing weight"},
                         Bad{1, 15, 0, -inf, "rank 1, token 15, slot 0: routing weight"}}) {
    auto layer = mok::synthetic::make_layer(config, 3);
    layer.weights[bad.rank][bad.token * config.top_k + bad.slot] = bad.weight;
    expect_pass_refused(forward, layer, {bad.says, "not finite"});
  }
  expect_next_pass_right(forward, mok::synthetic::make_layer(config, 3));
}

// One rank's pass state on the GPU, as the layout says: the schedule a pass
// left there, read back.
mok::RankSchedule read_schedule(const void* state, const mok::world::PassStateLayout& layout, int El,
                                int32_t padded_rows) {
  mok::RankSchedule s;
  s.expert_rows.resize(static_cast<size_t>(El));
  s.expert_offset.resize(static_cast<size_t>(El) + 1);
  const auto* base = static_cast<const uint8_t*>(state);
  MOK_CUDA_CHECK(cudaMemcpy(s.expert_rows.data(), base + layout.expert_rows.offset, El * sizeof(int32_t),
                            cudaMemcpyDeviceToHost));
  MOK_CUDA_CHECK(cudaMemcpy(s.expert_offset.data(), base + layout.expert_offset.offset, (El + 1) * sizeof(int32_t),
                            cudaMemcpyDeviceToHost));
  s.rows.resize(static_cast<size_t>(padded_rows));
  MOK_CUDA_CHECK(cudaMemcpy(s.rows.data(), base + layout.rows.offset, padded_rows * sizeof(mok::RowSource),
                            cudaMemcpyDeviceToHost));
  return s;
}

void expect_same_schedule(const mok::RankSchedule& got, const mok::RankSchedule& want, const std::string& what) {
  EXPECT_EQ(got.expert_rows, want.expert_rows) << what;
  EXPECT_EQ(got.expert_offset, want.expert_offset) << what;
  ASSERT_EQ(got.rows.size(), want.rows.size()) << what;
  for (size_t i = 0; i < want.rows.size(); ++i) {
    const mok::RowSource& g = got.rows[i];
    const mok::RowSource& w = want.rows[i];
    ASSERT_TRUE(g.rank == w.rank && g.token == w.token && g.slot == w.slot) << what << ": row " << i;
  }
}

// Caller-owned pass state: one world object serves two layers, each pass
// keeps its schedule in its layer's state, and a later pass of another layer
// leaves it intact (the backward will read it). In the virtual world and in
// the device-ordered one (whose peers read an owner's schedule length from
// its counters, never its state).
TEST(FusedForward, CallerOwnedPassStateKeepsEachLayersSchedule) {
  MOK_REQUIRE_HOPPER();
  const auto config = mok::make_config(mok::find_shape("small"), 2, 200);
  const int El = config.experts_per_rank();
  for (bool device_ordered : {false, true}) {
    SCOPED_TRACE(device_ordered ? "device-ordered" : "host-ordered");
    auto options = small_ring(128, 2);
    options.device_ordered = device_ordered;
    mok::FusedForward forward(config, options);
    const auto layout = mok::world::pass_state_layout(config, mok::world::fused_kernel_facts());
    ASSERT_EQ(forward.pass_state_bytes(), layout.bytes);
    const auto layer_a = mok::synthetic::make_layer(config, 21, RoutingMode::kUniform);
    const auto layer_b = mok::synthetic::make_layer(config, 22, RoutingMode::kSkewed);
    DeviceLayer device_a(layer_a), device_b(layer_b);
    std::vector<void*> state_a(2), state_b(2);
    for (int r = 0; r < 2; ++r) {
      MOK_CUDA_CHECK(cudaMalloc(&state_a[r], forward.pass_state_bytes()));
      MOK_CUDA_CHECK(cudaMalloc(&state_b[r], forward.pass_state_bytes()));
      MOK_CUDA_CHECK(cudaMemset(state_a[r], 0xff, forward.pass_state_bytes()));  // poisoned
      MOK_CUDA_CHECK(cudaMemset(state_b[r], 0xff, forward.pass_state_bytes()));
    }
    auto with_state = [](std::vector<mok::RankTensors> t, const std::vector<void*>& state) {
      for (size_t r = 0; r < t.size(); ++r) t[r].pass_state = state[r];
      return t;
    };
    device_a.poison_outputs();
    forward.run(with_state(device_a.tensors(), state_a));
    forward.check();
    const auto out_a = device_a.download_outputs();
    device_b.poison_outputs();
    forward.run(with_state(device_b.tensors(), state_b));
    forward.check();
    expect_close_to_reference(device_b.download_outputs(), reference_out(layer_b));
    expect_close_to_reference(out_a, reference_out(layer_a));
    // A pass without a state (the world's own) changes neither.
    forward.run(device_b.tensors());
    forward.check();
    const auto schedule_a = mok::build_schedule(config, layer_a.routing(), {128, 1});
    const auto schedule_b = mok::build_schedule(config, layer_b.routing(), {128, 1});
    for (int r = 0; r < 2; ++r) {
      const std::string rank = "rank " + std::to_string(r);
      expect_same_schedule(read_schedule(state_a[r], layout, El, schedule_a.ranks[r].padded_rows()),
                           schedule_a.ranks[r], "layer a, " + rank);
      expect_same_schedule(read_schedule(state_b[r], layout, El, schedule_b.ranks[r].padded_rows()),
                           schedule_b.ranks[r], "layer b, " + rank);
    }
    // The same bits as without a caller's state.
    device_a.poison_outputs();
    forward.run(device_a.tensors());
    forward.check();
    EXPECT_EQ(device_a.download_outputs(), out_a);
    for (int r = 0; r < 2; ++r) {
      MOK_CUDA_CHECK(cudaFree(state_a[r]));
      MOK_CUDA_CHECK(cudaFree(state_b[r]));
    }
  }
}

TEST(FusedForward, AMisalignedPassStateIsRefusedBeforeLaunch) {
  MOK_REQUIRE_HOPPER();
  const auto config = mok::make_config(mok::find_shape("small"), 1, 64);
  mok::FusedForward forward(config, small_ring(128, 1));
  const auto layer = mok::synthetic::make_layer(config, 5);
  DeviceLayer device(layer);
  void* state = nullptr;
  MOK_CUDA_CHECK(cudaMalloc(&state, forward.pass_state_bytes() + 16));
  auto tensors = device.tensors();
  tensors[0].pass_state = static_cast<uint8_t*>(state) + 4;
  try {
    forward.run(tensors);
    ADD_FAILURE() << "a misaligned pass state was accepted";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0: pass_state"), std::string::npos) << e.what();
  }
  MOK_CUDA_CHECK(cudaFree(state));
}

TEST(FusedForward, RepeatedIdsOnOneRankNeverOverrunAnotherRanksSchedule) {
  MOK_REQUIRE_HOPPER();
  // small at R = 8: one expert per rank, top-2. Every token of rank 3 names
  // expert 0 twice: rank 0 counts two rows per such token before rank 3's own
  // check aborts the pass. The error must be clean, and the next pass right.
  const auto config = mok::make_config(mok::find_shape("small"), 8, 64);
  mok::FusedForward forward(config, small_ring(128, 2));
  auto layer = mok::synthetic::make_layer(config, 4);
  for (int32_t& id : layer.expert_ids[3]) id = 0;
  DeviceLayer bad(layer);
  forward.run(bad.tensors());
  try {
    forward.check();
    ADD_FAILURE() << "no error";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3, token "), std::string::npos) << e.what();
  }
  const auto good_layer = mok::synthetic::make_layer(config, 4);
  DeviceLayer good(good_layer);
  good.poison_outputs();
  forward.run(good.tensors());
  forward.check();
  expect_close_to_reference(good.download_outputs(), reference_out(good_layer));
}

}  // namespace
