// The block-scaled FP8 mainloop: e4m3 operands with power-of-two (ue8m0)
// scales, one per 1 x 128 block of an A row and one per 128 x 128 block of
// B (include/mok/fp8.hpp). A stage holds one 128-deep block of K, so each
// stage's tensor-core partial sum is promoted to fp32 on the CUDA cores with
// its two scales before the next one starts: Hopper's FP8 accumulator keeps
// fewer bits than fp32, and a promotion every 128 of K bounds the loss (the
// DeepSeek-V3 recipe).
//
// Per element and stage: part = sum over the stage's K of a * b (four
// m64nNk32 wgmma, in order, the first overwriting), then
//   acc = part * (sa * sb)                 first stage
//   acc = fma_rn(part, sa * sb, acc)       later stages
// (computed as the fma from acc = -0.0 for the first stage too: the same bits,
// start_promotions). sa * sb is an exact power of two, so the rescaling
// rounds nothing. The same
// sequence for every element whatever the tile's place or the grid.
//
// Two partial sums take turns, so that a warpgroup's promotions overlap its
// own next wgmma: in the 128 x 128 and split-N tiles (mma_fp8_tile), stage
// kb + 1's wgmma run while stage kb's 64-register partial is promoted; in the
// wide tile (mma_fp8_wide_tile), a stage's four 64-column quarters take two
// 32-register partials in turn. With one partial, a warpgroup's tensor work
// stops for every promotion and the two consumer warpgroups (which read the
// same stages) promote at the same moments (ncu: tensor pipe 47% busy,
// docs/perf-notes.md q1, q9). The order of operations on every element is
// the same whichever way, so are the bits.
#pragma once

#include <cstdint>
#include <type_traits>

#include "device/gemm/fp8_stage_scales.cuh"
#include "device/gemm/tile_config.cuh"
#include "device/pipeline/stage_ring.cuh"
#include "device/ptx/async_copy.cuh"
#include "device/ptx/cluster.cuh"
#include "device/ptx/wgmma.cuh"
#include "device/ptx/wgmma_fp8.cuh"
#include "device/quant/e4m3.cuh"
#include "device/sched/grouped_tiles.cuh"

namespace mok::device {

// Where a grouped FP8 GEMM's scales are (ue8m0 bytes, row-major).
struct Fp8Scales {
  const uint8_t* a;  // [m_total, k_blocks]: one per row and 128 of K (not read by the wide tile: see mma_fp8_tile)
  const uint8_t* b;  // [G, n_blocks, k_blocks]: one per 128 x 128 block of each group's B
  int32_t k_blocks;  // K / 128
  int32_t n_blocks;  // B rows / 128 (SwiGLU: 2N / 128)
  int32_t m_total;
  int32_t up_rows;   // SwiGLU: N, where the up rows start in B (a tile's gate and up halves have a scale each)
};

// acc before a tile's first promotion: -0.0 in every element, so that every
// promotion can be the same fused multiply-add, fma(part, s, acc). For the
// first one, fma(part, s, -0.0) is the product rounded once -- what a
// multiply gives, bit for bit, the sign of a zero product included (x + -0
// is x for every x, +0 too). A first promotion chosen at run time
// (`kb == 0 ? multiply : fma`) made ptxas issue both instructions for every
// accumulator of every stage, one of them predicated off.
template <int kCount>
__device__ __forceinline__ void start_promotions(float (&acc)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) acc[i] = -0.0f;
}

// Four m64nNk32 e4m3 wgmma over one 128-deep stage into `part` (N = 128
// for a 64-register partial, 64 for the wide tile's 32-register quarters;
// the first overwriting it), committed as one group.
template <int kRegs>
__device__ __forceinline__ void issue_fp8_stage(float (&part)[kRegs], uint64_t desc_a, uint64_t desc_b) {
  static_assert(kRegs == 64 || kRegs == 32, "m64n128k32 or m64n64k32");
  wgmma::fence_operands(part);
  wgmma::fence();
#pragma unroll
  for (int k = 0; k < 128 / 32; ++k) {
    const uint64_t a = wgmma::advance_k_bytes(desc_a, 32 * k), b = wgmma::advance_k_bytes(desc_b, 32 * k);
    if constexpr (kRegs == 64) {
      wgmma::mma_m64n128k32_e4m3(part, a, b, k > 0 ? 1u : 0u);
    } else {
      wgmma::mma_m64n64k32_e4m3_sw128_lo(part, static_cast<uint32_t>(a), static_cast<uint32_t>(b),
                                         k > 0 ? 1u : 0u);
    }
  }
  wgmma::commit_group();
}

// The wide FP8 tile's K loop (Cfg 128 x 256, rows split: warpgroup c its
// 64 rows c * 64 ..). A warpgroup holds 128 accumulators (the layout of an
// m64n256 one: column chunk j = 0..31 at acc[4j ..]) and two 32-register
// partial sums, which the stage's four 64-column quarters of B take in
// turns: quarter q + 1's wgmma run while quarter q's partial is promoted
// into acc[32q ..], so a warpgroup's own tensor work does not stop for its
// promotions (with one 64-column-half partial it did, and the two
// warpgroups, released by the same stage barrier, promoted at the same
// moments: the tensor cores ~58% busy, perf-notes q8). The next stage's first
// quarter is issued before this stage's last is promoted. Quarters 0, 1
// are half 0 of B (the gate rows of a gate/up tile, the first 128 weight
// rows of a plain one), quarters 2, 3 half 1, each half with its own B scale.
// Per element the same K order inside a stage and the same promotion as
// every other tile: the same bits. Per stage it reads 48 KB from L2 (16 KB
// of A, 32 of B) for 8.4 MFLOP of tensor work. No wgmma or wait sits in a
// conditional branch (ptxas would serialise them all): the loop is left in
// its middle after the last stage, whose quarter 3 is promoted after it.
// A's scales come with the stage (gemm/fp8_stage_scales.cuh: the fused
// forward's producer copies them into a slot per stage), read from shared
// memory once the stage is taken: rows `a_row` and `a_row` + 8 of the tile
// (a tile past the ring's rows cannot occur: see RingScaleStageCopy).
// B's from the tile's table in shared memory (TileBScalePairs, at shared
// address `b_pairs`, one pair per k-block), a stage ahead. No global load
// is left in the loop: one there let ptxas move the wait for a stage's last
// quarter above the promotion of the quarter before (fp8_stage_scales.cuh).
// `a_slots`: the A-scale slots' shared-window address.
template <class Cfg, class Release, class OnStall>
__device__ __forceinline__ void mma_fp8_wide_tile(GemmSharedStorage<Cfg>& smem, StageRing<Cfg::kStages>& ring,
                                                  int consumer, float (&acc)[Cfg::kAccRegs], const Fp8Scales& scales,
                                                  uint32_t a_slots, int a_row, uint32_t b_pairs,
                                                  const Release& release, const OnStall& on_stall) {
  static_assert(Cfg::kAccRegs == 128, "four 32-register quarters a warpgroup");
  constexpr int kQuarter = 32;
  struct StageScales {
    float top0, low0, top1, low1;
  };
  struct BScales {
    float half0, half1;
  };
  auto load_b_scales = [&](int kb) {
    const uint32_t pair = tile_b_scale_pair(b_pairs, kb);
    return BScales{ue8m0_value(pair & 0xffu), ue8m0_value(pair >> 8)};
  };
  // Each product of two powers of two: exact.
  auto stage_scales = [&](int held, const BScales& sb) {
    const float sa_top = ue8m0_value(stage_scale_byte<Cfg::kStages, Cfg::kBlockM>(a_slots, held, a_row));
    const float sa_low = ue8m0_value(stage_scale_byte<Cfg::kStages, Cfg::kBlockM>(a_slots, held, a_row + 8));
    return StageScales{__fmul_rn(sa_top, sb.half0), __fmul_rn(sa_low, sb.half0), __fmul_rn(sa_top, sb.half1),
                       __fmul_rn(sa_low, sb.half1)};
  };
  // Defined before their first wgmma (which overwrites them), so that no
  // register of theirs is undefined when a wgmma chain reads it: otherwise
  // ptxas serialises every wgmma of the kernel (C7514 / C7515, perf-notes q7).
  float part_even[kQuarter];  // quarters 0 and 2
  float part_odd[kQuarter];   // quarters 1 and 3
  start_promotions(part_even);
  start_promotions(part_odd);
  // Quarter q's partial into acc[32q ..]: d[4j + 2h + e], row half h.
  auto promote = [&](float(&part)[kQuarter], auto quarter, const StageScales& sc) {
    constexpr int kQ = decltype(quarter)::value;
    const float top = kQ < 2 ? sc.top0 : sc.top1;
    const float low = kQ < 2 ? sc.low0 : sc.low1;
    wgmma::fence_operands(part);
    // The top row's 16 products first, then the low row's: runs of one scale
    // register, which the operand reuse cache serves on every FFMA that does
    // not yield (ptxas yields every other one). The scale's register read is
    // what costs: the loop alone takes ~160 cycles a stage more than with an
    // immediate scale (tools/mok_wgmma_bench, docs/perf-notes.md v9; read
    // there as the FFMA's third register read against the tensor cores' own
    // register traffic). Each element's operation is the same as in any
    // order: the same bits.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < kQuarter / 4; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 4 * j + 2 * h + e;  // d[4j + 2h + e]: row half h
          acc[kQ * kQuarter + i] = __fmaf_rn(part[i], h ? low : top, acc[kQ * kQuarter + i]);
        }
      }
    }
  };
  struct StageDescs {
    uint64_t a, b;
    int held;
  };
  // Stage 0's descriptors, made once: stage s's are theirs moved by s stages
  // (the stages are equal, 1 KB-aligned blocks, and no shared-memory address
  // overflows the descriptor's 14-bit start field), so a stage costs one
  // multiply-add each instead of the address arithmetic again. No lane-0
  // broadcast: each quarter's low halves go through uniform_lo below, which
  // is what puts them on the uniform datapath (a broadcast here only
  // lengthened the chain from a task's rows_ready wait to its first wgmma by
  // two shuffles and their divergence checks).
  constexpr uint64_t kStageStep = sizeof(smem.stages[0]) >> 4;  // one stage, in descriptor units
  const uint64_t a_stage0 = wgmma::smem_desc_k_sw128(smem.stages[0].a + consumer * 64 * Cfg::kRowBytes);
  const uint64_t b_stage0 = wgmma::smem_desc_k_sw128(smem.stages[0].b);
  // The next stage, taken with no wgmma in flight: with one in flight
  // across the stall-checking wait loop, ptxas serialised every wgmma of the
  // kernel (C7514), even where the loop ran only after a wait_group<0>.
  auto take_stage = [&]() {
    ring.consumer_wait(on_stall);
    const int held = ring.stage;
    ring.advance();
    const uint64_t step = static_cast<uint64_t>(held) * kStageStep;
    return StageDescs{a_stage0 + step, b_stage0 + step, held};
  };
  constexpr uint64_t kQuarterStep = (64 * Cfg::kRowBytes) >> 4;  // 64 rows of B, in descriptor units
  start_promotions(acc);
  const int k_blocks = scales.k_blocks;  // >= 1: K >= 128 is a layer rule (forward_options.cpp)
  // B's scales one stage ahead (from the task's table); A's from the stage
  // once it is taken, beside its first quarter's issue: no instruction
  // between the stage wait and that wgmma waits for them (the shared loads'
  // latency passes under the previous stage's last promotion).
  // A quarter's two descriptors (their low halves: the m64n64k32 wrapper
  // adds the constant high half) through redux.sync, whose result ptxas
  // keeps in a uniform register, at the quarter's issue: so the quarter's
  // four k-steps are built on the uniform datapath (UIADD3) where wgmma reads
  // them. Without it ptxas built all 16 of a stage's descriptor pairs at its
  // top in ordinary registers and moved each half over (66 R2UR and ~36 more
  // instructions a stage and warp, 321 instructions in all against 275;
  // docs/perf-notes.md v25). A warp-uniform value's maximum over the warp is
  // itself: the same descriptors, the same bits.
  auto uniform_lo = [](uint64_t desc) {
    return static_cast<uint64_t>(__reduce_max_sync(0xffffffffu, static_cast<uint32_t>(desc)));
  };
  // The first stage's descriptors before its wait, as each next stage's
  // below: the ring's current stage is the one take_stage waits for.
  const uint64_t first_step = static_cast<uint64_t>(ring.stage) * kStageStep;
  const uint64_t first_a = uniform_lo(a_stage0 + first_step), first_b = uniform_lo(b_stage0 + first_step);
  BScales sb = load_b_scales(0);
  StageDescs cur = take_stage();
  issue_fp8_stage(part_even, first_a, first_b);
  StageScales sc = stage_scales(cur.held, sb);
  int kb = 0;
  // Each turn: stage kb's quarter 0 is in flight in part_even. Quarters 0..2
  // are promoted while the next quarter runs, quarter 3 while the next
  // stage's quarter 0 does; the next stage is taken between the two, after
  // a wait_group<0> (see take_stage). One copy of the loop body, left in its
  // middle after the last stage (peeled copies of wgmma made ptxas
  // serialise them too).
  while (true) {
    sb = load_b_scales(min(kb + 1, k_blocks - 1));
    issue_fp8_stage(part_odd, uniform_lo(cur.a), uniform_lo(cur.b + 1 * kQuarterStep));
    wgmma::wait_group<1>();
    promote(part_even, std::integral_constant<int, 0>{}, sc);
    issue_fp8_stage(part_even, uniform_lo(cur.a), uniform_lo(cur.b + 2 * kQuarterStep));
    wgmma::wait_group<1>();
    promote(part_odd, std::integral_constant<int, 1>{}, sc);
    issue_fp8_stage(part_odd, uniform_lo(cur.a), uniform_lo(cur.b + 3 * kQuarterStep));
    wgmma::wait_group<1>();
    promote(part_even, std::integral_constant<int, 2>{}, sc);
    // The next stage's first descriptors while quarter 3 still runs (the
    // ring has moved past this stage already: ring.stage is the next one),
    // so that from the drain to the next stage's first wgmma only the
    // release, the stage wait and the issue remain.
    const uint64_t next_step = static_cast<uint64_t>(ring.stage) * kStageStep;
    const uint64_t next_a = uniform_lo(a_stage0 + next_step), next_b = uniform_lo(b_stage0 + next_step);
    wgmma::wait_group<0>();
    release(cur.held);  // quarter 3 done: the stage's last reads (its A scales were read at its start)
    if (kb + 1 >= k_blocks) break;
    cur = take_stage();
    issue_fp8_stage(part_even, next_a, next_b);
    const StageScales next_sc = stage_scales(cur.held, sb);
    promote(part_odd, std::integral_constant<int, 3>{}, sc);
    sc = next_sc;
    ++kb;
  }
  promote(part_odd, std::integral_constant<int, 3>{}, sc);
}

// The wide tile's two B-scale rows (offsets into Fp8Scales::b, k_blocks
// bytes each): a gate/up tile's gate block (weight rows n0 ..) and up block
// (rows up_rows + n0 ..), a plain tile's blocks n0 / 128 and the next. What
// the row resolver stages into the task's TileBScalePairs.
struct Fp8BScaleRows {
  int32_t half0, half1;
};
template <class Cfg>
__device__ __forceinline__ Fp8BScaleRows fp8_wide_b_scale_rows(const Fp8Scales& scales, const GemmTile& tile) {
  static_assert(Cfg::kElement == ElementType::kE4M3 && !Cfg::kSplitN && Cfg::kBlockN == 256 && Cfg::kBlockM == 128,
                "the wide FP8 tile");
  const int32_t group = tile.group * scales.n_blocks;
  const int32_t half0 = (group + tile.n0 / 128) * scales.k_blocks;
  const int32_t half1 =
      Cfg::kGateUp ? (group + (scales.up_rows + tile.n0) / 128) * scales.k_blocks : half0 + scales.k_blocks;
  return {half0, half1};
}

// Consumer warpgroup `consumer`: acc = its 64 rows of the tile over the whole
// K, promoted stage by stage. Rows at or past m_total are zeros (never stored).
// kAScalesInStage: A's scales come with the stages, in the slots at shared
// address `a_slots` (gemm/fp8_stage_scales.cuh): the fused FP8 forward's
// wide tiles, whose A scales other SMs write during the kernel (its rings).
// Otherwise (the grouped GEMM's tiles) they are the caller's row-major
// array, written before the launch and read through the non-coherent cache.
// The wide tile reads B's scales from the table at shared address `b_pairs`
// (the task's TileBScalePairs, staged from fp8_wide_b_scale_rows); the
// others from the caller's array.
// kPartials: 2 (below), or 1 where the registers for a second partial sum
// are not there (the fused forward's consumers hold more state than the
// grouped GEMM's: with two, ptxas spilled ~7 KB per thread there). The
// order of operations on every element is the same, so are the bits.
template <class Cfg, bool kAScalesInStage = false, int kPartials = 2, class OnStall = TrapOnStall>
__device__ __forceinline__ void mma_fp8_tile(GemmSharedStorage<Cfg>& smem, StageRing<Cfg::kStages>& ring,
                                             int consumer, const GemmTile& tile, const Fp8Scales& scales,
                                             float (&acc)[Cfg::kAccRegs], const OnStall& on_stall = {},
                                             uint32_t a_slots = 0, uint32_t b_pairs = 0) {
  // A warpgroup's wgmma is m64n128k32: 128 weight rows, one 128 x 128 B
  // scale block per stage (a split-N tile's warpgroups take 128 rows each:
  // warpgroup c the stage's B rows 128 c .. 128 c + 127).
  constexpr bool kSplitN = Cfg::kSplitN;
  // The wide tile (128 x 256, rows split between the warpgroups): each
  // warpgroup's 64 rows against all 256 B rows, in four 64-row quarters
  // through two 32-register partial sums (mma_fp8_wide_tile).
  constexpr bool kWide = !kSplitN && Cfg::kBlockN == 256;
  static_assert(Cfg::kElement == ElementType::kE4M3 && Cfg::kBlockK == 128 &&
                    (Cfg::kBlockN == 128 || (Cfg::kBlockN == 256 && (kSplitN || Cfg::kBlockM == 128))),
                "one 128 x 128 B scale block per wgmma group and one 128-deep A scale block per stage");
  static_assert(kAScalesInStage == kWide,
                "the wide tile (the fused forward's) takes A's scales from its stages, the others (the grouped "
                "GEMM's) from the caller's row-major array");
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32) % 4;
  // This thread's rows: row, row + 8 (split N: both warpgroups hold the same rows).
  const int row = tile.row0 + (kSplitN ? 0 : consumer * 64) + warp * 16 + lane / 4;
  // Scale positions as 32-bit offsets from the (kernel-parameter) scale
  // arrays rather than pointers: a register each instead of two, which the
  // SwiGLU instantiation needs to keep its two partial sums unspilled. Rows
  // at or past m_total read row m_total - 1's scale: their operand rows are
  // TMA's zero fill, so any finite scale gives them zeros.
  const int32_t a_top = min(row, scales.m_total - 1) * scales.k_blocks;
  const int32_t a_low = min(row + 8, scales.m_total - 1) * scales.k_blocks;
  // B's scale rows (the tiles other than the wide one, which reads its
  // table): the tile's one 128-row block; a SwiGLU tile's gate half
  // (rows n0 ..) and up half (rows up_rows + n0 ..) are 64 rows each, each
  // inside one block, with a scale each. A split-N tile's warpgroups read
  // one block each: the gate/up tile's warpgroup 0 the gate block and 1 the
  // up block; the plain tile's warpgroup c the block of weight rows n0 +
  // 128 c .. (n0 is a multiple of 256: block n0 / 128 + c). Selects on the
  // warpgroup-uniform `consumer`, no branch.
  constexpr bool kSwiGLU = Cfg::kEpilogue == EpilogueKind::kSwiGLU;  // two halves per warpgroup
  constexpr bool kSplitPlain = kSplitN && !Cfg::kGateUp;            // two neighbouring blocks
  const int32_t b_group = tile.group * scales.n_blocks;
  const int32_t b_up = Cfg::kGateUp ? (b_group + (scales.up_rows + tile.n0) / 128) * scales.k_blocks : 0;
  const int32_t b_block = tile.n0 / 128 + (kSplitPlain ? consumer : 0);
  const int32_t b_gate =
      kSplitN && Cfg::kGateUp && consumer == 1 ? b_up : (b_group + b_block) * scales.k_blocks;
  const bool releaser = lane == 0;
  // Hands stage s back: to this CTA's producer and, with A multicast, to the
  // peer's, which writes half of this CTA's stage too.
  auto release = [&](int s) {
    if (!releaser) return;
    ring.consumer_release(s);
    if constexpr (Cfg::kClusterN == 2) mbarrier_arrive_peer(&ring.empty[s], cluster_rank() ^ 1u);
  };
  if constexpr (kWide) {
    mma_fp8_wide_tile<Cfg>(smem, ring, consumer, acc, scales, a_slots, row - tile.row0, b_pairs, release, on_stall);
  } else {
    // Issues the next stage's wgmma into `part` (one committed group); returns
    // the stage it reads, to be handed back once that group has retired.
    auto issue = [&](float(&part)[Cfg::kAccRegs]) {
      ring.consumer_wait(on_stall);
      const int held = ring.stage;
      auto& stage = smem.stages[held];
      const uint64_t desc_a = wgmma::smem_desc_k_sw128(stage.a + (kSplitN ? 0 : consumer * 64 * Cfg::kRowBytes));
      const uint64_t desc_b = wgmma::smem_desc_k_sw128(stage.b + (kSplitN ? consumer * 128 * Cfg::kRowBytes : 0));
      issue_fp8_stage(part, desc_a, desc_b);
      wgmma::fence_operands(part);
      ring.advance();
      return held;
    };
    // Stage kb's four scales (sa * sb for the top and low rows, gate and up
    // halves), loaded before its wait so that the wait hides their latency.
    // Each is a product of two powers of two: exact.
    struct StageScales {
      float top, low, top_up, low_up;
    };
    auto load_scales = [&](int kb) {
      const float sb = ue8m0_value(__ldg(scales.b + b_gate + kb));
      const float sb_up = kSwiGLU ? ue8m0_value(__ldg(scales.b + b_up + kb)) : sb;
      const float sa_top = ue8m0_value(__ldg(scales.a + a_top + kb));
      const float sa_low = ue8m0_value(__ldg(scales.a + a_low + kb));
      return StageScales{__fmul_rn(sa_top, sb), __fmul_rn(sa_low, sb), __fmul_rn(sa_top, sb_up),
                         __fmul_rn(sa_low, sb_up)};
    };
    // Adds stage kb's retired partial sum into acc. d[4j + 2h + e]: row half
    // h, column chunk j (SwiGLU: the up half from chunk BN / 16 on).
    auto promote = [&](float(&part)[Cfg::kAccRegs], const StageScales& sc) {
      wgmma::fence_operands(part);
#pragma unroll
      for (int i = 0; i < Cfg::kAccRegs; ++i) {
        const bool up = kSwiGLU && i >= Cfg::kAccRegs / 2;
        const float s = ((i / 2) % 2) ? (up ? sc.low_up : sc.low) : (up ? sc.top_up : sc.top);
        acc[i] = __fmaf_rn(part[i], s, acc[i]);
      }
    };
    start_promotions(acc);
    // Stage kb is in flight in part_even (kb even) or part_odd (kb odd) when
    // the loop reaches it; the next one is issued before kb is waited for. No
    // wgmma or wait sits in a conditional branch: ptxas serializes every wgmma
    // of a kernel whose accumulators it must guard on a divergent path.
    float part_even[Cfg::kAccRegs];
    const int k_blocks = scales.k_blocks;
    if constexpr (kPartials == 1) {
      // The scales one stage ahead: with one partial sum, a scale load issued
      // in the stage that promotes with it leaves its latency (L2, for scales
      // written in this pass) between the wgmma's end and the promotion.
      StageScales next = load_scales(0);
      for (int kb = 0; kb < k_blocks; ++kb) {
        const StageScales sc = next;
        if (kb + 1 < k_blocks) next = load_scales(kb + 1);
        const int stage = issue(part_even);
        wgmma::wait_group<0>();
        release(stage);
        promote(part_even, sc);
      }
      return;
    }
    float part_odd[Cfg::kAccRegs];
    int held = issue(part_even);
    int kb = 0;
    while (true) {
      if (kb + 1 >= k_blocks) break;  // the last stage is in part_even
      StageScales sc = load_scales(kb);
      int next = issue(part_odd);
      wgmma::wait_group<1>();
      release(held);
      promote(part_even, sc);
      held = next;
      ++kb;
      if (kb + 1 >= k_blocks) break;  // the last stage is in part_odd
      sc = load_scales(kb);
      next = issue(part_even);
      wgmma::wait_group<1>();
      release(held);
      promote(part_odd, sc);
      held = next;
      ++kb;
    }
    const StageScales last = load_scales(kb);
    wgmma::wait_group<0>();
    release(held);
    if (kb % 2 == 0) {
      promote(part_even, last);
    } else {
      promote(part_odd, last);
    }
  }
}

}  // namespace mok::device
