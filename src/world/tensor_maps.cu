#include "world/tensor_maps.hpp"

#include <array>
#include <type_traits>

#include "common/cuda_check.hpp"
#include "device/host/driver_api.hpp"
#include "device/roles/gemm_role.cuh"
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

CUtensorMap encode(const char* what, const void* base, int rank, std::array<cuuint64_t, 4> dims,
                   std::array<cuuint64_t, 3> strides, std::array<cuuint32_t, 4> box) {
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  return device::encode_tensor_map_tiled(what, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, static_cast<cuuint32_t>(rank),
                                         base, dims.data(), strides.data(), box.data(), element_strides,
                                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
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
  maps[device::kMapRingX] = encode("ring x", v.ring_x, 2, {H, ring_rows, 1, 1}, {h2, 0, 0}, box_a);
  maps[device::kMapW13] = encode("w13", t.w13, 4, {H, I, 2, El}, {h2, h2 * I, 2 * h2 * I}, box_gate_up);
  maps[device::kMapRingH] = encode("ring h", v.ring_h, 2, {I, ring_rows, 1, 1}, {i2, 0, 0}, box_a);
  maps[device::kMapW2] = encode("w2", t.w2, 3, {I, H, El, 1}, {i2, i2 * H, 0}, box_down);
  if (T > 0) maps[device::kMapX] = encode("x", t.x, 2, {H, T, 1, 1}, {h2, 0, 0}, box_a);
  if (S > 0 && T > 0) {
    maps[device::kMapSharedW13] = encode("shared w13", t.shared_w13, 4, {H, S, 2, 1}, {h2, h2 * S, 2 * h2 * S},
                                         box_gate_up);
    maps[device::kMapSharedH] = encode("shared h", v.shared_h, 2, {S, T_pad, 1, 1}, {s2, 0, 0}, box_a);
    maps[device::kMapSharedW2] = encode("shared w2", t.shared_w2, 3, {S, H, 1, 1}, {s2, s2 * H, 0}, box_down);
  }
  return maps;
}

void upload_tensor_maps(const RankTensorMaps& maps, const device::RankView& v, cudaStream_t stream) {
  MOK_CUDA_CHECK(cudaMemcpyAsync(const_cast<CUtensorMap*>(v.maps), maps.data(), sizeof(maps),
                                 cudaMemcpyHostToDevice, stream));
}

}  // namespace mok::world
