// Compile-time shape of one grouped-GEMM tile and the shared memory it needs.
// Model dimensions (N, K, groups, rows) are never template parameters: only
// the tile shape, the stage count and the epilogue kind are.
#pragma once

#include <cstdint>

namespace mok::device {

enum class EpilogueKind : int {
  kPlain = 0,   // out[m, n] = sum_k A[m, k] * B[g, n, k]
  kSwiGLU = 1,  // out[m, n] = silu(gate) * up, gate/up = rows n and N + n of w13[g]
};

template <int kBlockM_, int kBlockN_, int kStages_, EpilogueKind kEpilogue_>
struct GemmTileConfig {
  static constexpr int kBlockM = kBlockM_;  // A rows per tile: 64 per consumer warpgroup
  static constexpr int kBlockN = kBlockN_;  // weight rows per tile = the wgmma N
  static constexpr int kBlockK = 64;        // one 128-byte swizzle row of bf16
  static constexpr int kStages = kStages_;
  static constexpr EpilogueKind kEpilogue = kEpilogue_;

  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);  // + 1 producer warpgroup
  // Output columns per tile: SwiGLU turns 2 x (kBlockN / 2) gate/up columns
  // into kBlockN / 2 outputs.
  static constexpr int kOutCols = kEpilogue == EpilogueKind::kSwiGLU ? kBlockN / 2 : kBlockN;
  static constexpr int kAccRegs = kBlockN / 2;  // fp32 accumulators per consumer thread

  static constexpr uint32_t kABytes = kBlockM * kBlockK * 2;
  static constexpr uint32_t kBBytes = kBlockN * kBlockK * 2;
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;
  // Epilogue staging: each consumer warp owns 16 rows x 64 columns of bf16.
  static constexpr int kStagingBytesPerWarp = 16 * 64 * 2;
  // Groups whose counts the kernel copies to shared memory (more: read from
  // global memory as the walk goes).
  static constexpr int kSmemGroups = 512;

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
  static_assert(kBlockN == 128 || kBlockN == 256, "BN: a wgmma N this build wraps");
  static_assert(kEpilogue != EpilogueKind::kSwiGLU || kBlockN % 128 == 0,
                "SwiGLU needs whole 64-column output slabs");
  static_assert(kOutCols % 64 == 0, "the epilogue stores 64-column slabs");
};

template <class Cfg>
struct alignas(1024) GemmSharedStorage {
  struct alignas(1024) Stage {
    uint16_t a[Cfg::kBlockM * Cfg::kBlockK];  // [BM rows][64 k], 128B-swizzled by TMA
    uint16_t b[Cfg::kBlockN * Cfg::kBlockK];  // [BN rows][64 k], 128B-swizzled by TMA
  };
  Stage stages[Cfg::kStages];
  alignas(16) uint8_t staging[Cfg::kConsumerWarps][Cfg::kStagingBytesPerWarp];
  int32_t group_rows[Cfg::kSmemGroups];
  int32_t group_offset[Cfg::kSmemGroups];
  uint64_t full[Cfg::kStages];
  uint64_t empty[Cfg::kStages];
};

// Dynamic shared memory to request: the storage plus slack to align it.
template <class Cfg>
constexpr int gemm_smem_bytes() {
  return static_cast<int>(sizeof(GemmSharedStorage<Cfg>)) + 1024;
}

}  // namespace mok::device
