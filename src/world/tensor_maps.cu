#include "world/tensor_maps.hpp"

#include <array>
#include <type_traits>

#include "common/cuda_check.hpp"
#include "device/host/driver_api.hpp"
#include "device/roles/gemm_role.cuh"
#include "world/pass_tiles.hpp"
#include "world/rank_tensors.hpp"
#include "world/workspace_layout.hpp"

namespace mok::world {
namespace {

// The boxes are the operands of the pass table's kinds (their tile shapes).
using Pass = protocol::ForwardPass;
template <int kKind>
using KindCfg = device::KindConfig<protocol::KindSpec<Pass, kKind>>;
using Swiglu = KindCfg<Pass::kGateUp>;  // gate/up tasks: B = gate rows then up rows, one box each
using Plain = KindCfg<Pass::kDown>;     // down tasks: B rows = the whole n-tile
static_assert(std::is_same_v<Swiglu, KindCfg<Pass::kSharedGateUp>> && std::is_same_v<Plain, KindCfg<Pass::kSharedDown>>,
              "the shared expert's maps use the routed kinds' boxes");

// Boxes are the GEMM tiles' operands: A is [BM rows][BK], B [BN rows][BK].
constexpr cuuint32_t kBoxK = Plain::kBlockK;
constexpr cuuint32_t kBoxRowsA = Plain::kBlockM;
constexpr cuuint32_t kBoxRowsGateUp = Swiglu::kBlockN / 2;
constexpr cuuint32_t kBoxRowsDown = Plain::kBlockN;
static_assert(Plain::kBlockM == Swiglu::kBlockM && Plain::kBlockK == Swiglu::kBlockK,
              "both task shapes load A with one box");
// The table's tile shapes give the same boxes (pass_tiles.hpp), which is how
// the FP8 table's boxes are read below.
static_assert(boxes_reading<Pass>(protocol::Tensor::kRingX) == OperandBoxes{kBoxK, kBoxRowsA, kBoxRowsGateUp} &&
                  boxes_reading<Pass>(protocol::Tensor::kRingH) == OperandBoxes{kBoxK, kBoxRowsA, kBoxRowsDown},
              "pass_tiles.hpp reads the boxes the device configurations use");

// The FP8 forward (LayerConfig::dtype kFP8E4M3): its routed operands are
// e4m3 (one byte an element) in its own tiles; its shared expert stays the
// bf16 forward's, maps and all.
using Fp8Pass = protocol::ForwardFp8Pass;
constexpr OperandBoxes kFp8GateUp = boxes_reading<Fp8Pass>(protocol::Tensor::kRingX);
constexpr OperandBoxes kFp8Down = boxes_reading<Fp8Pass>(protocol::Tensor::kRingH);
static_assert(tile_reading<Fp8Pass>(protocol::Tensor::kRingX).element == ElementType::kE4M3 &&
                  tile_reading<Fp8Pass>(protocol::Tensor::kRingH).element == ElementType::kE4M3,
              "the FP8 table's routed kinds read e4m3 operands");
static_assert(kFp8GateUp.k * element_bytes(ElementType::kE4M3) == 128 && kFp8Down.k == kFp8GateUp.k &&
                  kFp8GateUp.rows_a == kFp8Down.rows_a,
              "one 128-byte swizzle row of K per box, one A box for both routed kinds");
static_assert(tile_reading<Fp8Pass>(protocol::Tensor::kX).element == ElementType::kBF16 &&
                  tile_reading<Fp8Pass>(protocol::Tensor::kSharedH).element == ElementType::kBF16 &&
                  boxes_reading<Fp8Pass>(protocol::Tensor::kX).k == kBoxK &&
                  boxes_reading<Fp8Pass>(protocol::Tensor::kSharedH).k == kBoxK,
              "the FP8 forward's shared expert is bf16 (in its own tiles: its boxes come from its table)");

CUtensorMap encode(const char* what, CUtensorMapDataType type, const void* base, int rank,
                   std::array<cuuint64_t, 4> dims, std::array<cuuint64_t, 3> strides, std::array<cuuint32_t, 4> box) {
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  return device::encode_tensor_map_tiled(what, type, static_cast<cuuint32_t>(rank), base, dims.data(), strides.data(),
                                         box.data(), element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                         CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}
CUtensorMap encode(const char* what, const void* base, int rank, std::array<cuuint64_t, 4> dims,
                   std::array<cuuint64_t, 3> strides, std::array<cuuint32_t, 4> box) {
  return encode(what, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, rank, dims, strides, box);
}

// The routed maps of an fp8 layer: e4m3 bytes (UINT8 to TMA, which only
// moves them), row pitches H and I bytes, the FP8 tiles' boxes.
void encode_fp8_routed_maps(RankTensorMaps& maps, cuuint64_t H, cuuint64_t I, cuuint64_t El, cuuint64_t ring_rows,
                            const device::RankView& v, const RankTensors& t) {
  constexpr CUtensorMapDataType kBytes = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  auto box = [](int32_t k, int32_t rows) {
    return std::array<cuuint32_t, 4>{static_cast<cuuint32_t>(k), static_cast<cuuint32_t>(rows), 1, 1};
  };
  maps[device::kMapRingX] = encode("ring x (e4m3)", kBytes, v.ring_x, 2, {H, ring_rows, 1, 1}, {H, 0, 0},
                                   box(kFp8GateUp.k, kFp8GateUp.rows_a));
  maps[device::kMapW13] = encode("w13 (e4m3)", kBytes, t.w13, 4, {H, I, 2, El}, {H, H * I, 2 * H * I},
                                 box(kFp8GateUp.k, kFp8GateUp.rows_b));
  maps[device::kMapRingH] = encode("ring h (e4m3)", kBytes, v.ring_h, 2, {I, ring_rows, 1, 1}, {I, 0, 0},
                                   box(kFp8Down.k, kFp8Down.rows_a));
  maps[device::kMapW2] = encode("w2 (e4m3)", kBytes, t.w2, 3, {I, H, El, 1}, {I, I * H, 0},
                                box(kFp8Down.k, kFp8Down.rows_b));
}

}  // namespace

RankTensorMaps encode_tensor_maps(const LayerConfig& c, const FusedForwardOptions& options,
                                  const device::RankView& v, const RankTensors& t, int rank) {
  const cuuint64_t H = static_cast<cuuint64_t>(c.hidden), I = static_cast<cuuint64_t>(c.intermediate),
                   S = static_cast<cuuint64_t>(c.shared_width()), El = static_cast<cuuint64_t>(c.experts_per_rank());
  const cuuint64_t ring_rows = static_cast<cuuint64_t>(options.ring_slots) * static_cast<cuuint64_t>(options.minibatch_rows);
  const cuuint64_t h2 = H * 2, i2 = I * 2, s2 = S * 2;  // bf16 row pitches in bytes
  // This pass's rows of x (the layer's count is only the capacity): TMA must
  // not read past the caller's tensor.
  const cuuint64_t T = static_cast<cuuint64_t>(pass_tokens(c, t, rank));
  const cuuint64_t T_pad = align_up(T, kBoxRowsA);
  const std::array<cuuint32_t, 4> box_a{kBoxK, kBoxRowsA, 1, 1};
  const std::array<cuuint32_t, 4> box_gate_up{kBoxK, kBoxRowsGateUp, 1, 1};
  const std::array<cuuint32_t, 4> box_down{kBoxK, kBoxRowsDown, 1, 1};
  RankTensorMaps maps{};
  if (c.dtype == DType::kFP8E4M3) {
    encode_fp8_routed_maps(maps, H, I, El, ring_rows, v, t);
  } else {
    maps[device::kMapRingX] = encode("ring x", v.ring_x, 2, {H, ring_rows, 1, 1}, {h2, 0, 0}, box_a);
    maps[device::kMapW13] = encode("w13", t.w13, 4, {H, I, 2, El}, {h2, h2 * I, 2 * h2 * I}, box_gate_up);
    maps[device::kMapRingH] = encode("ring h", v.ring_h, 2, {I, ring_rows, 1, 1}, {i2, 0, 0}, box_a);
    maps[device::kMapW2] = encode("w2", t.w2, 3, {I, H, El, 1}, {i2, i2 * H, 0}, box_down);
  }
  // The shared expert's boxes: its kinds' tiles in the layer's table.
  const bool fp8 = c.dtype == DType::kFP8E4M3;
  const OperandBoxes shared_gate_up =
      fp8 ? boxes_reading<Fp8Pass>(protocol::Tensor::kX) : boxes_reading<Pass>(protocol::Tensor::kX);
  const OperandBoxes shared_down =
      fp8 ? boxes_reading<Fp8Pass>(protocol::Tensor::kSharedH) : boxes_reading<Pass>(protocol::Tensor::kSharedH);
  auto box = [](cuuint32_t k, int32_t rows) { return std::array<cuuint32_t, 4>{k, static_cast<cuuint32_t>(rows), 1, 1}; };
  if (T > 0) maps[device::kMapX] = encode("x", t.x, 2, {H, T, 1, 1}, {h2, 0, 0}, box(kBoxK, shared_gate_up.rows_a));
  if (S > 0 && T > 0) {
    maps[device::kMapSharedW13] = encode("shared w13", t.shared_w13, 4, {H, S, 2, 1}, {h2, h2 * S, 2 * h2 * S},
                                         box(kBoxK, shared_gate_up.rows_b));
    maps[device::kMapSharedH] = encode("shared h", v.shared_h, 2, {S, T_pad, 1, 1}, {s2, 0, 0},
                                       box(kBoxK, shared_down.rows_a));
    maps[device::kMapSharedW2] = encode("shared w2", t.shared_w2, 3, {S, H, 1, 1}, {s2, s2 * H, 0},
                                        box(kBoxK, shared_down.rows_b));
  }
  return maps;
}

void upload_tensor_maps(const RankTensorMaps& maps, const device::RankView& v, cudaStream_t stream) {
  MOK_CUDA_CHECK(cudaMemcpyAsync(const_cast<CUtensorMap*>(v.maps), maps.data(), sizeof(maps),
                                 cudaMemcpyHostToDevice, stream));
}

}  // namespace mok::world
