// Compile-time shape of one grouped-GEMM tile and the shared memory it needs.
// Model dimensions (N, K, groups, rows) are never template parameters: only
// the tile shape (src/common/gemm_tile_shape.hpp: what the pass tables and
// the host's tensor maps see too), the element type, the stage count and the
// epilogue kind are.
#pragma once

#include <cstdint>

#include "common/gemm_tile_shape.hpp"

namespace mok::device {

// kClusterN_ = 2: two CTAs of a cluster take neighbouring n-tiles of the same
// rows and each multicasts half of the shared A box into both
// (ptx/cluster.cuh); 1: a CTA loads its whole tile.
// kStageStride_: bytes from one stage to the next when more than A + B (a
// fused pass whose kinds load stages of different sizes walks one ring:
// every kind must see stage s at the same address).
template <int kBlockM_, int kBlockN_, int kStages_, EpilogueKind kEpilogue_,
          ElementType kElement_ = ElementType::kBF16, OperandMajor kBMajor_ = OperandMajor::kK,
          OperandMajor kAMajor_ = OperandMajor::kK, int kClusterN_ = 1, int kStageStride_ = 0>
struct GemmTileConfig {
  static constexpr GemmTileShape kShape{kBlockM_, kBlockN_, kEpilogue_, kElement_, kBMajor_, kAMajor_};
  static constexpr int kBlockM = kBlockM_;  // A rows per tile: 64 per consumer warpgroup
  static constexpr int kBlockN = kBlockN_;  // weight rows per tile = the wgmma N
  static constexpr int kBlockK = kShape.block_k();  // one 128-byte swizzle row of the element type
  static constexpr int kRowBytes = 128;             // bytes of one operand row of a stage
  static constexpr int kStages = kStages_;
  static constexpr EpilogueKind kEpilogue = kEpilogue_;
  static constexpr ElementType kElement = kElement_;
  static constexpr OperandMajor kBMajor = kBMajor_;
  static constexpr OperandMajor kAMajor = kAMajor_;
  static constexpr int kClusterN = kClusterN_;
  // An MN-major operand (B, or the A of a weight gradient) arrives as BN / kMNBlock boxes of [kBlockK rows][kMNBlock
  // columns], one 128-byte swizzle row of N per k.
  static constexpr int kMNBlock = kRowBytes / element_bytes(kElement_);

  static constexpr bool kSplitN = kShape.splits_n();  // see GemmTileShape::splits_n
  static constexpr bool kGateUp = kShape.gate_up();    // B: gate rows, then up rows
  static constexpr int kConsumerWarpgroups = kSplitN ? 2 : kBlockM / 64;
  static constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);  // + 1 producer warpgroup
  // Output columns per tile: SwiGLU turns 2 x (kBlockN / 2) gate/up columns
  // into kBlockN / 2 outputs. A plain split-N tile's 256 are 128 per
  // warpgroup (warpgroup c: columns n0 + 128 c ..).
  static constexpr int kOutCols = kShape.out_cols();
  // fp32 accumulators per consumer thread: its warpgroup's 64 x BN (split
  // N: 64 x BN / 2) share of the tile, 64 x N / 128 per thread.
  static constexpr int kAccRegs = kSplitN ? kBlockN / 4 : kBlockN / 2;

  static constexpr uint32_t kABytes = kBlockM * kRowBytes;
  static constexpr uint32_t kBBytes = kBlockN * kRowBytes;
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;  // what TMA fills (the full barrier's bytes)
  static constexpr uint32_t kStagePadBytes =
      kStageStride_ > static_cast<int>(kStageBytes) ? kStageStride_ - kStageBytes : 0;
  // Epilogue staging: each consumer warp owns 16 rows x 64 columns of bf16.
  static constexpr int kStagingBytesPerWarp = 16 * 64 * 2;
  // The split-N gate/up tile: the accumulator halves the two consumer
  // warpgroups hand each other (gemm/tile_epilogue_swiglu_quantize.cuh), fp32
  // [2][2 warps][regs][32 lanes]. A plain split-N tile's warpgroups store
  // their own columns and exchange nothing.
  static constexpr int kExchangeFloats =
      kSplitN && kEpilogue == EpilogueKind::kSwiGLUQuantize ? 2 * 2 * kAccRegs * 32 : 0;

  // Register split. setmaxnreg only moves registers within what the CTA got
  // at launch: kThreads x the entry budget ptxas gives __launch_bounds__(
  // kThreads, 1) (65536 / 384 -> 168), i.e. 64,512, not 65,536. The producer
  // warpgroup keeps 40; the consumers share the rest, rounded down to a
  // multiple of 8 (232 with two consumer warpgroups: 40 x 128 + 232 x 256 =
  // 64,512 exactly). Asking for more than the launch gave makes
  // setmaxnreg.inc wait forever.
  static constexpr int kEntryRegs = (65536 / kThreads) / 8 * 8;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs =
      ((kThreads * kEntryRegs - 128 * kProducerRegs) / (128 * kConsumerWarpgroups)) / 8 * 8 > 240
          ? 240
          : ((kThreads * kEntryRegs - 128 * kProducerRegs) / (128 * kConsumerWarpgroups)) / 8 * 8;
  static_assert(128 * kProducerRegs + 128 * kConsumerWarpgroups * kConsumerRegs <= kThreads * kEntryRegs,
                "the register split must fit in what the CTA has at launch");

  static_assert(kBlockM % 64 == 0 && kBlockM >= 64 && kBlockM <= 128, "BM: 64 or 128");
  static_assert(kClusterN == 1 || (kClusterN == 2 && kBlockM == 128 && kElement == ElementType::kE4M3 &&
                                   kEpilogue == EpilogueKind::kPlain && kBMajor == OperandMajor::kK),
                "A multicast: the plain FP8 tile, each CTA of the pair loading 64 of its 128 A rows");
  static_assert(!kSplitN || (kBlockM == 64 && kBlockN == 256 && kElement == ElementType::kE4M3 &&
                             (kEpilogue == EpilogueKind::kPlain || kEpilogue == EpilogueKind::kSwiGLUQuantize)),
                "a split-N tile is an FP8 64 x 256 tile, 128 weight rows a warpgroup: the plain one "
                "(output columns n0 .. n0 + 255) or the gate/up one (128 gate + 128 up rows)");
  static_assert(kSplitN || kEpilogue != EpilogueKind::kSwiGLUQuantize ||
                    (kBlockM == 128 && kBlockN == 256 && kElement == ElementType::kE4M3),
                "the SwiGLU-quantize epilogue needs one whole scale block of h per row: a split-N tile, or the "
                "wide 128 x 256 FP8 tile (128 gate + 128 up rows for each warpgroup's 64 rows)");
  static_assert(kBlockN == 128 || kBlockN == 256, "BN: a wgmma N this build wraps");
  static_assert(!kGateUp || kBlockN % 128 == 0,
                "SwiGLU needs whole 64-column output slabs");
  static_assert(kOutCols % 64 == 0, "the epilogue stores 64-column slabs");
  static_assert(kAMajor == OperandMajor::kK || kEpilogue == EpilogueKind::kWeightGrad,
                "an MN-major A is a weight gradient's (rows^T); every other tile reads A K-major");
  static_assert(kBMajor == OperandMajor::kK || !kGateUp,
                "a SwiGLU B interleaves gate and up rows along N: K-major only");
};

template <uint32_t kA, uint32_t kB, uint32_t kPad>
struct alignas(1024) GemmStage {
  uint8_t a[kA];  // [BM rows][kBlockK], 128B-swizzled by TMA
  uint8_t b[kB];  // [BN rows][kBlockK], 128B-swizzled by TMA
  uint8_t pad[kPad];
};
template <uint32_t kA, uint32_t kB>
struct alignas(1024) GemmStage<kA, kB, 0> {
  uint8_t a[kA];
  uint8_t b[kB];
};

template <class Cfg>
struct alignas(1024) GemmSharedStorage {
  using Stage = GemmStage<Cfg::kABytes, Cfg::kBBytes, Cfg::kStagePadBytes>;
  Stage stages[Cfg::kStages];
  // 1 KB-aligned (it is, after whole stages): a weight-gradient tile's TMA
  // store reads 128-byte-swizzled boxes from it (weight_grad_tile.cuh).
  alignas(1024) uint8_t staging[Cfg::kConsumerWarps][Cfg::kStagingBytesPerWarp];
  uint64_t full[Cfg::kStages];
  uint64_t empty[Cfg::kStages];
};


}  // namespace mok::device
