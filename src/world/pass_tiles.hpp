// What a forward pass table says about its tiles that the host needs beyond
// its tile heights (protocol::kinds_block_m): the TMA boxes of each mapped
// operand, read from the table's tile shapes (the same GemmTileShape the
// device configurations derive from), so that a table with other tiles --
// the FP8 forward's 64-row e4m3 routed tiles -- gets its maps without a
// second copy of any number. Plain C++ (constexpr): the CPU side and the
// CUDA side both read it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/gemm_tile_shape.hpp"
#include "mok/layer_config.hpp"
#include "protocol/pass_forward.hpp"
#include "protocol/pass_forward_fp8.hpp"
#include "protocol/pass_table.hpp"

namespace mok::world {

// The tile of the kind that reads `a` as its A operand (kX, kRingX, kRingH,
// kSharedH: each is read by one kind of a forward table).
template <class Pass>
constexpr GemmTileShape tile_reading(protocol::Tensor a) {
  for (int32_t k = 0; k < Pass::kNumKinds; ++k) {
    if (Pass::kKinds[k].a == a) return Pass::kKinds[k].tile;
  }
  return GemmTileShape{0, 0, EpilogueKind::kPlain};
}

// The TMA boxes of one GEMM kind's operands, in elements: A is [block_m
// rows][block_k], B [rows_b][block_k] -- a gate/up kind loads its gate and
// up rows as two boxes of block_n / 2 rows each.
struct OperandBoxes {
  int32_t k = 0;       // K per stage: one 128-byte swizzle row of the element type
  int32_t rows_a = 0;
  int32_t rows_b = 0;
  constexpr bool operator==(const OperandBoxes&) const = default;
};
constexpr OperandBoxes boxes_of(GemmTileShape t) {
  return OperandBoxes{t.block_k(), t.block_m, t.gate_up() ? t.block_n / 2 : t.block_n};
}

// The boxes of the kind reading `a` in `Pass`.
template <class Pass>
constexpr OperandBoxes boxes_reading(protocol::Tensor a) {
  return boxes_of(tile_reading<Pass>(a));
}

// Bytes of one element of the routed experts' rings (x and h rows) and
// weights for a layer of `dtype`: e4m3 in the FP8 forward, bf16 otherwise.
// x itself, the shared expert and every output stay bf16 in both.
constexpr size_t routed_element_bytes(DType dtype) { return dtype == DType::kFP8E4M3 ? 1 : 2; }

}  // namespace mok::world
