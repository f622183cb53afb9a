// The shape of one GEMM tile, as the pass tables (src/protocol), the host's
// tensor maps and the device tile configurations all see it: the n-tile
// width of a task comes from here, never from a second constant. Plain C++.
#pragma once

#include <cstdint>

namespace mok {

// What the consumers do with the fp32 accumulators of a tile.
enum class EpilogueKind : int32_t {
  kPlain = 0,   // out[m, n] = sum_k A[m, k] * B[n, k], rounded to bf16
  kSwiGLU = 1,  // out[m, n] = silu(gate) * up: B holds gate rows then up rows (w13), half the columns out
  // The backward's (docs/backward-design.md):
  kSwiGLUBackward = 2,  // acc = g: writes [da | db], w * h and <g, h> parts from the saved gate/up
  kWeightGrad = 3,      // fp32 tile of a weight gradient, stored or added to the caller's buffer
  // The FP8 forward's gate/up (docs/fp8-forward-design.md, section 3): h =
  // silu(gate) * up quantized to e4m3 with one ue8m0 scale per 128 columns
  // of a row. One tile must see a whole scale block: 128 gate + 128 up
  // rows, either split between the consumer warpgroups (the 64 x 256
  // split-N tile: 0 the gate rows, 1 the up rows) or each warpgroup's own
  // (the wide 128 x 256 tile, gemm/fp8_mainloop.cuh).
  kSwiGLUQuantize = 4,
  // The backward's recompute mode (docs/backward-design.md): the gate/up
  // GEMM keeps its raw accumulators, [gate | up] rounded once to bf16 (what
  // the forward's training mode saves), instead of h (roles/gemm_consumer.cuh).
  kGateUpPreact = 5,
};

// Operand element type. Each type has its own wgmma instruction and K step:
// bf16 (k16 per instruction, 64 per stage) and block-scaled e4m3 (k32 per
// instruction, 128 per stage: one scale block of K per stage,
// gemm/fp8_mainloop.cuh).
enum class ElementType : int32_t { kBF16 = 0, kE4M3 = 1 };

constexpr int32_t element_bytes(ElementType t) {
  return t == ElementType::kBF16 ? 2 : t == ElementType::kE4M3 ? 1 : 0;
}

// Which dimension of an operand is contiguous in memory. kK: [rows, K] (A
// rows, or B as nn.Linear stores weights, [N, K]); kMN: B as [K, N], the
// layout the backward's data gradients read their weights in (dgrad of
// y = x W^T is dx = dy W, whose B is W itself).
enum class OperandMajor : int32_t { kK = 0, kMN = 1 };

struct GemmTileShape {
  int32_t block_m;  // A rows per tile: 64 per consumer warpgroup
  int32_t block_n;  // B rows per tile = the wgmma N
  EpilogueKind epilogue;
  ElementType element = ElementType::kBF16;
  OperandMajor b_major = OperandMajor::kK;
  OperandMajor a_major = OperandMajor::kK;  // kMN: A as [K, M] (a weight gradient's rows^T)

  // K per pipeline stage: one 128-byte swizzle row of the element type.
  constexpr int32_t block_k() const { return 128 / element_bytes(element); }
  // Output columns of one tile (the task's n-tile width).
  constexpr int32_t out_cols() const { return gate_up() ? block_n / 2 : block_n; }
  // B holds gate rows then up rows (w13): half the columns come out.
  constexpr bool gate_up() const {
    return epilogue == EpilogueKind::kSwiGLU || epilogue == EpilogueKind::kSwiGLUQuantize ||
           epilogue == EpilogueKind::kGateUpPreact;
  }
  // The consumer warpgroups share the tile's rows and split its N (64 rows a
  // tile) instead of splitting its rows (64 per warpgroup, sharing N): the
  // FP8 64 x 256 tiles, whose warpgroups each run m64n128k32 on their own
  // 128 weight rows -- one 128 x 128 B scale block apiece (the gate/up
  // tile's gate and up blocks; the plain tile's two neighbouring blocks).
  // The 128 x 128 FP8 tiles split rows as the bf16 ones do.
  constexpr bool splits_n() const {
    return element == ElementType::kE4M3 && block_m == 64 && block_n == 256;
  }
};

}  // namespace mok
