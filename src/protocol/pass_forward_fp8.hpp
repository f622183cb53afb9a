// The fused FP8 forward of one rank, as a table (issue 16;
// docs/fp8-forward-design.md says why each tile is what it is). Its dataflow
// is the bf16 forward's (pass_forward.hpp): the same kinds, counters, ticket
// order, dispatch and combine, which it takes from ForwardPass by deriving
// from it. Only the tiles and the rings' contents differ:
//
//   kind            tile                            A                       out
//   shared gate/up  128 x 256 bf16, SwiGLU          x (bf16)                shared_h (bf16)
//   shared down     128 x 256 bf16, plain           shared_h                shared_out (bf16)
//   gate/up         128 x 256 e4m3, wide,           x ring (e4m3, scales)   h ring: 128 h columns a tile,
//                   SwiGLU, h quantized                                     e4m3, a ue8m0 scale per row
//   down            128 x 256 e4m3, wide, plain     h ring (e4m3, scales)   home rows (bf16)
//
// So its m-tile (tile_m, to which the schedule pads every expert) and its
// token tile are 128 rows. The routed tiles are the wide FP8 tiles
// (gemm/fp8_mainloop.cuh, mma_fp8_wide_tile): each consumer warpgroup 64
// rows against all 256 B rows, 128 accumulators and two 32-register
// partial sums (a 64-row quarter of B each, taking turns) a thread; a
// stage moves 0.6x the L2 bytes per FLOP of the 64 x 256 split-N tiles the
// first kernel ran (docs/perf-notes.md q5). The shared expert
// stays bf16 (issue 16), in the bf16 forward's own kinds and tiles (with
// the split-N FP8 kinds, which promote two 64-register sums beside 64
// accumulators, ptxas spilled the promotion next to them, q4; the wide
// kinds hold 128 accumulators as these do). Every kind's stages are 48 KB
// (the wide FP8 stage, 16 KB A + 32 KB B, and the bf16 128 x 256 x 64 one),
// so the fused kernel's shared-memory layout is the bf16 forward's.
//
// The tensors are the bf16 forward's, in FP8 where the routed GEMMs read
// them: kRingX holds the pulled x rows as e4m3 values plus one ue8m0 scale
// per 128 columns of a row (k-block-major, protocol/ring_scales.hpp, so that
// a tile's scales come into its stages with its A and B boxes; the dispatch
// quantizes while it stages, so its waits and signals are the bf16
// forward's), kRingH the gate/up epilogue's h
// in the same format (a tile's 128 h columns are one scale block, so each
// gate/up task writes whole blocks and h_ready still counts its n-tiles), and
// kW13 / kW2 are e4m3 weights with a scale per 128 x 128 block. x, the shared
// expert's weights and everything it writes stay bf16. The scales beside the
// ring rows and the weights are device::Fp8RankOperands.
#pragma once

#include <cstdint>

#include "common/gemm_tile_shape.hpp"
#include "protocol/pass_forward.hpp"
#include "protocol/pass_table.hpp"

namespace mok::protocol {

inline constexpr GemmTileShape kFp8ForwardGateUpTile{128, 256, EpilogueKind::kSwiGLUQuantize, ElementType::kE4M3};
inline constexpr GemmTileShape kFp8ForwardDownTile{128, 256, EpilogueKind::kPlain, ElementType::kE4M3};

// Bytes of one pipeline stage of a tile: its A and B boxes, one 128-byte
// swizzle row of K per row (GemmTileShape::block_k) whatever the element.
constexpr int32_t stage_bytes(GemmTileShape t) { return (t.block_m + t.block_n) * 128; }
static_assert(!kFp8ForwardGateUpTile.splits_n() && !kFp8ForwardDownTile.splits_n(),
              "the routed kinds run the wide FP8 tiles (rows split between the warpgroups)");
static_assert(stage_bytes(kFp8ForwardGateUpTile) <= stage_bytes(kForwardSwiGLUTile) &&
                  stage_bytes(kFp8ForwardDownTile) <= stage_bytes(kForwardSwiGLUTile),
              "every kind's stage fits the bf16 forward's stage");

// A kind of another table with another tile.
constexpr TaskKindSpec with_tile(TaskKindSpec spec, GemmTileShape tile) {
  spec.tile = tile;
  return spec;
}

struct ForwardFp8Pass : ForwardPass {
  // Its rings hold block-scaled e4m3 rows: the dispatch quantizes what it pulls.
  static constexpr bool kFp8Rings = true;
  static constexpr TaskKindSpec kKinds[kNumKinds] = {
      ForwardPass::kKinds[kSharedGateUp],
      ForwardPass::kKinds[kSharedDown],
      with_tile(ForwardPass::kKinds[kGateUp], kFp8ForwardGateUpTile),
      with_tile(ForwardPass::kKinds[kDown], kFp8ForwardDownTile),
  };
};

static_assert(pass_table_is_consistent<ForwardFp8Pass>(), "the FP8 forward's table breaks a rule of pass_table.hpp");
static_assert(kinds_block_m<ForwardFp8Pass>(Rows::kSchedule) == 128 && kinds_block_m<ForwardFp8Pass>(Rows::kTokens) == 128,
              "the FP8 forward's m-tile and token tile are 128 rows");

using ForwardFp8Geometry = PassGeometry<ForwardFp8Pass>;
using ForwardFp8Counters = PassCounters<ForwardFp8Pass>;

}  // namespace mok::protocol
