// The workspace layout of one rank (src/world/workspace_layout.hpp), with no
// GPU: regions aligned, in bounds and disjoint, sized as the kernel reads
// them (bf16 and fp8 layers); the fingerprint moves with every field that
// fixes the layout and with nothing else; the 2^31-task bound refuses what
// it should.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "hopper_kernel_facts.hpp"
#include "layout_checks.hpp"
#include "mok/error.hpp"
#include "mok/presets.hpp"
#include "mok/row_source.hpp"
#include "protocol/counters.hpp"
#include "protocol/ring_scales.hpp"
#include "protocol/world_barrier.hpp"
#include "world/pass_tiles.hpp"
#include "world/workspace_layout.hpp"

namespace {

using mok::world::KernelFacts;
using mok::world::Region;

KernelFacts hopper_kernel() { return mok::test_support::hopper_kernel_facts(); }
KernelFacts hopper_fp8_kernel() { return mok::test_support::hopper_fp8_kernel_facts(); }

mok::FusedForwardOptions ring(int minibatch_rows, int ring_slots, int comm_ctas) {
  mok::FusedForwardOptions o;
  o.minibatch_rows = minibatch_rows;
  o.ring_slots = ring_slots;
  o.comm_ctas_per_rank = comm_ctas;
  o.ctas_per_rank = 66;
  return o;
}

void expect_aligned_disjoint_and_inside(const mok::world::RankLayout& layout) {
  mok::test_support::expect_aligned_disjoint_and_inside(mok::world::regions(layout), layout.bytes);
}

TEST(WorkspaceLayout, RegionsAreAlignedDisjointAndInsideTheAllocation) {
  for (const char* preset : {"tiny", "small", "medium", "deepseek-v3"}) {
    for (bool staged : {false, true}) {
      SCOPED_TRACE(testing::Message() << preset << (staged ? " staged" : ""));
      const auto config = mok::make_config(mok::find_shape(preset), std::vector<int>{0, 1, 300, 4096});
      for (int r = 0; r < config.world_size; ++r) {
        expect_aligned_disjoint_and_inside(mok::world::rank_layout(config, ring(256, 3, 4), hopper_kernel(), r, staged));
      }
    }
  }
}

TEST(WorkspaceLayout, Fp8RegionsAreAlignedDisjointAndInsideTheAllocation) {
  for (const char* preset : {"small", "medium", "deepseek-v3"}) {
    for (bool staged : {false, true}) {
      SCOPED_TRACE(testing::Message() << preset << (staged ? " staged" : ""));
      const auto config =
          mok::make_config(mok::find_shape(preset), std::vector<int>{0, 1, 300, 4096}, mok::DType::kFP8E4M3);
      for (int r = 0; r < config.world_size; ++r) {
        expect_aligned_disjoint_and_inside(
            mok::world::rank_layout(config, ring(192, 3, 4), hopper_fp8_kernel(), r, staged));
      }
    }
  }
}

TEST(WorkspaceLayout, SizesAreWhatTheKernelReadsForAPreset) {
  // small: H 256, I 128, 8 experts, top-2, one shared expert of width 128.
  const auto config = mok::make_config(mok::find_shape("small"), std::vector<int>{100, 37});
  const KernelFacts kernel = hopper_kernel();
  const auto L = mok::world::rank_layout(config, ring(256, 2, 3), kernel, 0, /*staged_inputs=*/true);
  const size_t ring_rows = 512, T = 100, k = 2, H = 256, I = 128, S = 128, El = 4;
  EXPECT_EQ(L.ring_x.bytes, ring_rows * H * 2);
  EXPECT_EQ(L.ring_h.bytes, ring_rows * I * 2);
  EXPECT_EQ(L.ring_x_scales.bytes, 0u);  // fp8 only
  EXPECT_EQ(L.ring_h_scales.bytes, 0u);
  EXPECT_EQ(L.combine.bytes, T * k * H * 2);
  EXPECT_EQ(L.shared_h.bytes, 128 * S * 2);  // tokens rounded up to one tile
  EXPECT_EQ(L.shared_out.bytes, T * H * 2);
  // The world's own pass state: the schedule.
  const mok::world::PassStateLayout state = mok::world::pass_state_layout(config, kernel);
  EXPECT_EQ(L.pass_state.bytes, state.bytes);
  EXPECT_EQ(state.expert_rows.bytes, El * 4);
  EXPECT_EQ(state.expert_offset.bytes, (El + 1) * 4);
  // Every entry of the world on this rank's experts, each expert padded.
  EXPECT_EQ(L.row_capacity, (100 + 37) * 2 + 4 * 127);
  EXPECT_EQ(state.rows.bytes, static_cast<size_t>(L.row_capacity) * sizeof(mok::RowSource));
  EXPECT_EQ(L.schedule_hist.bytes, 3u * 12 * El * 4);
  const size_t counter_bytes = mok::protocol::counter_words(L.geometry) * 4;
  EXPECT_EQ(L.counters[0].bytes, counter_bytes);
  EXPECT_EQ(L.counters[1].bytes, counter_bytes);
  EXPECT_EQ(L.barrier.bytes, sizeof(mok::protocol::WorldBarrierWords));
  EXPECT_EQ(L.maps.bytes, 8u * 128);
  EXPECT_EQ(L.staged_x.bytes, T * H * 2);
  EXPECT_EQ(L.staged_ids.bytes, T * k * 4);
  // The counters are sized for this rank's own shared-expert tiles.
  EXPECT_EQ(L.geometry.token_m_tiles, 1);
  EXPECT_EQ(L.geometry.ring_tiles(), 4);

  const auto unstaged = mok::world::rank_layout(config, ring(256, 2, 3), kernel, 0, /*staged_inputs=*/false);
  EXPECT_EQ(unstaged.staged_x.bytes, 0u);
  EXPECT_EQ(unstaged.staged_ids.bytes, 0u);
  EXPECT_LT(unstaged.bytes, L.bytes);
}

// An fp8 layer: e4m3 rings (a byte an element) with a ue8m0 scale per 128
// columns of each ring row, 128-row routed m-tiles (the schedule's padding,
// the ring's tiles), the shared expert's bf16 buffers as in bf16.
TEST(WorkspaceLayout, Fp8SizesAreWhatTheKernelReadsForAPreset) {
  const auto config = mok::make_config(mok::find_shape("small"), std::vector<int>{100, 37}, mok::DType::kFP8E4M3);
  const KernelFacts kernel = hopper_fp8_kernel();
  const auto L = mok::world::rank_layout(config, ring(256, 2, 3), kernel, 0, /*staged_inputs=*/true);
  const size_t ring_rows = 512, T = 100, k = 2, H = 256, I = 128, S = 128, El = 4;
  EXPECT_EQ(L.ring_x.bytes, ring_rows * H);
  EXPECT_EQ(L.ring_h.bytes, ring_rows * I);
  // k-block-major, [columns / 128][pitch]: 512 rows are their own pitch.
  EXPECT_EQ(mok::protocol::ring_scale_pitch(512), 512);
  EXPECT_EQ(L.ring_x_scales.bytes, (H / 128) * ring_rows);
  EXPECT_EQ(L.ring_h_scales.bytes, (I / 128) * ring_rows);
  // The rest as in bf16: x is pulled and combined in bf16, the shared expert
  // runs 128-row bf16 tiles over the rank's own tokens.
  EXPECT_EQ(L.combine.bytes, T * k * H * 2);
  EXPECT_EQ(L.shared_h.bytes, 128 * S * 2);
  EXPECT_EQ(L.shared_out.bytes, T * H * 2);
  EXPECT_EQ(L.staged_x.bytes, T * H * 2);
  EXPECT_EQ(L.staged_ids.bytes, T * k * 4);
  // Every entry of the world on this rank's experts, each expert padded to 128 rows.
  EXPECT_EQ(L.row_capacity, (100 + 37) * 2 + El * 127);
  EXPECT_EQ(L.geometry.tile_m, 128);
  EXPECT_EQ(L.geometry.ring_tiles(), 4);
  // The shared expert's counters count its 128-row token tiles.
  EXPECT_EQ(L.geometry.token_tile_m, 128);
  EXPECT_EQ(L.geometry.token_m_tiles, 1);
  EXPECT_EQ(mok::world::pass_shape(config, ring(256, 2, 3), kernel).token_tile_m,
            mok::protocol::shape_token_tile_m<mok::protocol::ForwardFp8Pass>());
  EXPECT_NO_THROW(mok::world::require_kernel_tiles(config, ring(256, 2, 3), kernel));
  // Facts of another height are refused (the first FP8 kernel's 64-row tiles).
  KernelFacts split_n = kernel;
  split_n.tile_m = 64;
  split_n.token_tile_m = 128;
  EXPECT_THROW(mok::world::require_kernel_tiles(config, ring(192, 2, 3), split_n), mok::Error);
  auto bf16_config = config;
  bf16_config.dtype = mok::DType::kBF16;
  EXPECT_THROW(mok::world::require_kernel_tiles(bf16_config, ring(192, 2, 3), split_n), mok::Error);
  EXPECT_NO_THROW(mok::world::require_kernel_tiles(bf16_config, ring(256, 2, 3), hopper_kernel()));
  const size_t counter_bytes = mok::protocol::counter_words(L.geometry) * 4;
  EXPECT_EQ(L.counters[0].bytes, counter_bytes);
  EXPECT_EQ(L.counters[1].bytes, counter_bytes);

  // The same layer in bf16 has no scale regions and twice the ring bytes.
  auto bf16 = config;
  bf16.dtype = mok::DType::kBF16;
  const auto B = mok::world::rank_layout(bf16, ring(256, 2, 3), hopper_kernel(), 0, true);
  EXPECT_EQ(B.ring_x_scales.bytes, 0u);
  EXPECT_EQ(B.ring_h_scales.bytes, 0u);
  EXPECT_EQ(B.ring_x.bytes, 512 * H * 2);
}

// The rings' scale arrays are k-block-major (protocol/ring_scales.hpp): a
// tile's rows at one k-block are contiguous (the producer's one bulk copy per
// stage), each k-block's rows start on a 16-byte boundary (the copy's source
// alignment).
TEST(WorkspaceLayout, RingScalesAreBlockMajorWithA16BytePitch) {
  using mok::protocol::ring_scale_bytes;
  using mok::protocol::ring_scale_index;
  using mok::protocol::ring_scale_pitch;
  EXPECT_EQ(ring_scale_pitch(128), 128);
  EXPECT_EQ(ring_scale_pitch(100), 112);
  EXPECT_EQ(ring_scale_pitch(1), 16);
  EXPECT_EQ(ring_scale_index(5, 0, 112), 5);
  EXPECT_EQ(ring_scale_index(5, 3, 112), 3 * 112 + 5);
  EXPECT_EQ(ring_scale_index(6, 3, 112), ring_scale_index(5, 3, 112) + 1);  // rows adjacent
  EXPECT_EQ(ring_scale_bytes(100, 7168), 56 * 112);
  // The last row's last block is the array's last byte but for the padding.
  EXPECT_EQ(ring_scale_index(99, 55, 112), ring_scale_bytes(100, 7168) - (112 - 100) - 1);
}

// The facts the FP8 instantiation takes from its table (pass_tiles.hpp):
// 128-row routed and shared tiles; its maps' boxes.
TEST(WorkspaceLayout, TheFp8TablesTilesAreWhatTheHostLaysOut) {
  using mok::protocol::ForwardFp8Pass;
  using mok::protocol::ForwardPass;
  using mok::protocol::Rows;
  using mok::protocol::Tensor;
  using mok::world::OperandBoxes;
  EXPECT_EQ(mok::protocol::kinds_block_m<ForwardPass>(Rows::kSchedule), 128);
  EXPECT_EQ(mok::protocol::kinds_block_m<ForwardPass>(Rows::kTokens), 128);
  EXPECT_EQ(mok::protocol::kinds_block_m<ForwardFp8Pass>(Rows::kSchedule), hopper_fp8_kernel().tile_m);
  EXPECT_EQ(mok::protocol::kinds_block_m<ForwardFp8Pass>(Rows::kTokens), hopper_fp8_kernel().token_tile_m);
  // Ring x: {128, 128}; w13: two boxes of 128 rows (gate, up); ring h:
  // {128, 128}; w2: {128, 256} (elements, e4m3: bytes).
  EXPECT_EQ(mok::world::boxes_reading<ForwardFp8Pass>(Tensor::kRingX), (OperandBoxes{128, 128, 128}));
  EXPECT_EQ(mok::world::boxes_reading<ForwardFp8Pass>(Tensor::kRingH), (OperandBoxes{128, 128, 256}));
  // The shared expert's: the bf16 forward's 128 x 256 tiles, K 64 per box
  // (gate/up: two boxes of 128 weight rows).
  EXPECT_EQ(mok::world::boxes_reading<ForwardFp8Pass>(Tensor::kX),
            mok::world::boxes_reading<ForwardPass>(Tensor::kX));
  EXPECT_EQ(mok::world::boxes_reading<ForwardFp8Pass>(Tensor::kSharedH),
            mok::world::boxes_reading<ForwardPass>(Tensor::kSharedH));
  EXPECT_EQ(mok::world::boxes_reading<ForwardFp8Pass>(Tensor::kX), (OperandBoxes{64, 128, 128}));
  EXPECT_EQ(mok::world::routed_element_bytes(mok::DType::kFP8E4M3), 1u);
  EXPECT_EQ(mok::world::routed_element_bytes(mok::DType::kBF16), 2u);
}

// A caller's pass state is carved like the world's own: aligned, disjoint,
// inside its size, and the same for every rank (the schedule's capacity is
// the world's).
TEST(WorkspaceLayout, PassStateRegionsAreAlignedDisjointAndInside) {
  const auto config = mok::make_config(mok::find_shape("medium"), std::vector<int>{300, 0, 17, 5});
  const mok::world::PassStateLayout S = mok::world::pass_state_layout(config, hopper_kernel());
  const Region regions[] = {S.expert_rows, S.expert_offset, S.rows};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(regions[i].offset % mok::world::kPassStateAlignment, 0u) << i;
    EXPECT_LE(regions[i].end(), S.bytes) << i;
    if (i > 0) EXPECT_LE(regions[i - 1].end(), regions[i].offset) << i;
  }
  EXPECT_EQ(S.bytes % mok::world::kPassStateAlignment, 0u);
  const int El = config.experts_per_rank();
  EXPECT_EQ(S.rows.bytes, static_cast<size_t>(mok::world::schedule_row_capacity(config, hopper_kernel())) *
                              sizeof(mok::RowSource));
  EXPECT_EQ(S.expert_offset.bytes, static_cast<size_t>(El + 1) * 4);
}

TEST(WorkspaceLayout, TheRegionZeroedAtCreationHoldsBothCounterSetsAndTheBarrier) {
  const auto config = mok::make_config(mok::find_shape("small"), 2, 64);
  const auto L = mok::world::rank_layout(config, ring(128, 1, 1), hopper_kernel(), 1, false);
  const Region zeroed = mok::world::zeroed_at_creation(L);
  for (const Region& r : {L.counters[0], L.counters[1], L.barrier}) {
    EXPECT_GE(r.offset, zeroed.offset);
    EXPECT_LE(r.end(), zeroed.end());
  }
  EXPECT_LE(zeroed.end(), L.maps.offset) << "the maps are written per pass, never zeroed";
}

TEST(WorkspaceLayout, FingerprintCoversEveryLayoutFieldAndNothingElse) {
  const auto config = mok::make_config(mok::find_shape("small"), std::vector<int>{64, 32});
  const auto options = ring(256, 2, 3);
  const KernelFacts kernel = hopper_kernel();
  const uint64_t base = mok::world::layout_fingerprint(config, options, kernel);
  EXPECT_EQ(base, mok::world::layout_fingerprint(config, options, kernel));

  using ConfigChange = std::function<void(mok::LayerConfig&)>;
  const std::vector<std::pair<const char*, ConfigChange>> config_changes = {
      {"hidden", [](auto& c) { c.hidden += 64; }},
      {"intermediate", [](auto& c) { c.intermediate += 64; }},
      {"num_experts", [](auto& c) { c.num_experts += 2; }},
      {"top_k", [](auto& c) { c.top_k += 1; }},
      {"shared width", [](auto& c) { c.num_shared_experts += 1; }},
      {"dtype", [](auto& c) { c.dtype = mok::DType::kFP8E4M3; }},
      {"world_size", [](auto& c) { c.world_size = 1; c.tokens_per_rank = {96}; }},
      {"tokens_per_rank", [](auto& c) { c.tokens_per_rank[1] += 1; }},
      {"token split", [](auto& c) { c.tokens_per_rank = {32, 64}; }},
  };
  for (const auto& [what, change] : config_changes) {
    auto changed = config;
    change(changed);
    EXPECT_NE(mok::world::layout_fingerprint(changed, options, kernel), base) << what;
  }
  using OptionChange = std::function<void(mok::FusedForwardOptions&)>;
  const std::vector<std::pair<const char*, OptionChange>> covered = {
      {"minibatch_rows", [](auto& o) { o.minibatch_rows = 384; }},
      {"ring_slots", [](auto& o) { o.ring_slots = 3; }},
      {"comm_ctas_per_rank", [](auto& o) { o.comm_ctas_per_rank = 4; }},
  };
  for (const auto& [what, change] : covered) {
    auto changed = options;
    change(changed);
    EXPECT_NE(mok::world::layout_fingerprint(config, changed, kernel), base) << what;
  }
  const std::vector<std::pair<const char*, OptionChange>> not_covered = {
      {"lookahead", [](auto& o) { o.lookahead = 3; }},
      {"ctas_per_rank", [](auto& o) { o.ctas_per_rank = 33; }},
      {"timeout_seconds", [](auto& o) { o.timeout_seconds = 1; }},
      {"barrier_timeout_seconds", [](auto& o) { o.barrier_timeout_seconds = 10; }},
      {"trace_events", [](auto& o) { o.trace_events = 100; }},
      {"device_ordered", [](auto& o) { o.device_ordered = true; }},
      {"process_rank", [](auto& o) { o.process_rank = 1; }},
  };
  for (const auto& [what, change] : not_covered) {
    auto changed = options;
    change(changed);
    EXPECT_EQ(mok::world::layout_fingerprint(config, changed, kernel), base) << what;
  }
  // The same shared width from other expert counts: the same layout.
  auto regrouped = config;
  regrouped.num_shared_experts = 2;
  regrouped.shared_intermediate = config.intermediate / 2;
  ASSERT_EQ(regrouped.shared_width(), config.shared_width());
  EXPECT_EQ(mok::world::layout_fingerprint(regrouped, options, kernel), base);

  using KernelChange = std::function<void(KernelFacts&)>;
  const std::vector<std::pair<const char*, KernelChange>> kernel_changes = {
      {"tile_m", [](auto& k) { k.tile_m = 64; }},
      {"token_tile_m", [](auto& k) { k.token_tile_m = 64; }},
      {"schedule_warps_per_cta", [](auto& k) { k.schedule_warps_per_cta = 8; }},
      {"tensor_maps", [](auto& k) { k.tensor_maps = 9; }},
      {"tensor_map_bytes", [](auto& k) { k.tensor_map_bytes = 256; }},
  };
  for (const auto& [what, change] : kernel_changes) {
    KernelFacts changed = kernel;
    change(changed);
    EXPECT_NE(mok::world::layout_fingerprint(config, options, changed), base) << what;
  }
}

TEST(WorkspaceLayout, TaskBoundRefusesPassesThatCouldReach2To31Tasks) {
  const KernelFacts kernel = hopper_kernel();
  // Within the layer's own limit (tokens x top_k < 2^30 rows) it takes wide
  // tiles: H 8192 and I 32768 give 32 + 256 n-tiles per m-tile, and 1.024e9
  // rows make 8e6 m-tiles, 2.3e9 tasks.
  const mok::LayerShape wide{"wide", 8192, 32768, 8, 8, 0, "test: over the task bound"};
  const auto huge = mok::make_config(wide, 1, 128'000'000);
  EXPECT_GT(mok::world::most_tasks_per_pass(huge, ring(2048, 4, 4), kernel), 0x7fffffffll);
  try {
    mok::world::require_task_bound(huge, ring(2048, 4, 4), kernel);
    ADD_FAILURE() << "a pass of more than 2^31 GEMM tasks was accepted";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("2^31"), std::string::npos) << e.what();
  }
  // A quarter of those tokens fits.
  const auto big = mok::make_config(wide, 1, 32'000'000);
  EXPECT_LT(mok::world::most_tasks_per_pass(big, ring(2048, 4, 4), kernel), 0x7fffffffll);
  EXPECT_NO_THROW(mok::world::require_task_bound(big, ring(2048, 4, 4), kernel));

  // The count itself: shared tasks of the largest rank plus routed tasks of
  // the largest schedule.
  const auto config = mok::make_config(mok::find_shape("small"), std::vector<int>{300, 10});
  const int64_t m_tiles = ((310 * 2 + 4 * 127) + 127) / 128;
  const int64_t shared = 3 * (1 + 1);  // 3 token tiles x (128/128 gate/up + 256/256 down)
  EXPECT_EQ(mok::world::most_tasks_per_pass(config, ring(256, 2, 1), kernel), shared + m_tiles * (1 + 1));

  // fp8: the FP8 table's tasks -- the bf16 forward's tiles in height and
  // width (128-row m-tiles; 128 h columns per gate/up task, 256 y columns per
  // down task), so the same count.
  auto fp8 = config;
  fp8.dtype = mok::DType::kFP8E4M3;
  EXPECT_EQ(mok::world::most_tasks_per_pass(fp8, ring(256, 2, 1), hopper_fp8_kernel()), shared + m_tiles * (1 + 1));
}

}  // namespace
