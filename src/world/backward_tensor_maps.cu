#include "world/backward_tensor_maps.hpp"

#include <cuda.h>

#include <array>
#include <cstdint>
#include <type_traits>

#include "device/host/driver_api.hpp"
#include "device/roles/gemm_role.cuh"
#include "protocol/pass_backward.hpp"
#include "world/workspace_layout.hpp"

namespace mok::world {
namespace {

using protocol::BackwardPass;

// The tiles of the backward's kinds: A boxes [BM rows][BK] (K-major), MN-major
// boxes [BK rows][64 columns].
using GradCfg = device::PassGemmCfg<BackwardPass>;
constexpr cuuint32_t kBoxK = GradCfg::kBlockK;
constexpr cuuint32_t kBoxRows = GradCfg::kBlockM;
constexpr cuuint32_t kBoxMN = GradCfg::kMNBlock;

CUtensorMap encode(const char* what, const void* base, cuuint32_t rank, std::array<cuuint64_t, 3> dims,
                   std::array<cuuint64_t, 2> strides, std::array<cuuint32_t, 3> box) {
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return device::encode_tensor_map_tiled(what, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, base, dims.data(),
                                         strides.data(), box.data(), element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                         CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// W13 as the gate/up tiles read it (recompute mode): [G][2][N][K], one box of
// [kBlockN / 2 rows][BK] for the gate rows and one for the up rows.
CUtensorMap encode_gate_up(const char* what, const void* base, cuuint64_t K, cuuint64_t N, cuuint64_t groups) {
  const cuuint64_t dims[4] = {K, N, 2, groups};
  const cuuint64_t strides[3] = {K * 2, N * K * 2, 2 * N * K * 2};
  const cuuint32_t box[4] = {kBoxK, static_cast<cuuint32_t>(GradCfg::kBlockN / 2), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  return device::encode_tensor_map_tiled(what, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, base, dims, strides, box,
                                         element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace

BackwardMaps encode_backward_maps(BackwardState& s, std::span<const BackwardRankTensors> ranks, bool bf16_grads) {
  const LayerConfig& c = s.config;
  const int first = s.core.launches.front().first_rank;
  const int served = static_cast<int>(ranks.size());
  // The maps of every rank (host only: a failure here enqueues nothing).
  const cuuint64_t H = static_cast<cuuint64_t>(c.hidden), I = static_cast<cuuint64_t>(c.intermediate),
                   S = static_cast<cuuint64_t>(c.shared_width()), El = static_cast<cuuint64_t>(c.experts_per_rank());
  const cuuint64_t P = static_cast<cuuint64_t>(s.layout.buffer_rows);
  const std::array<cuuint32_t, 3> box_a{kBoxK, kBoxRows, 1}, box_mn{kBoxMN, kBoxK, 1};
  // Sized for the recompute table, which has the most kinds; a pass uploads its own count.
  BackwardMaps maps;
  maps.sets.resize(static_cast<size_t>(served));
  s.with_params([&](auto& params) {
  using Pass = typename std::remove_reference_t<decltype(params)>::Pass;
  maps.count = static_cast<size_t>(device::kBackwardMaps<Pass>);
  auto map = [](int kind, int operand) { return static_cast<size_t>(protocol::map_index<Pass>(kind, operand)); };
  for (int r = first; r < first + served; ++r) {
    const BackwardRankTensors& t = ranks[static_cast<size_t>(r - first)];
    const auto& v = params.ranks[r];
    auto& m = maps.sets[static_cast<size_t>(r - first)];
    m = {};
    const cuuint64_t T = static_cast<cuuint64_t>(v.tokens);
    const cuuint64_t T_pad = align_up(T, kBoxRows);
    m[map(Pass::kGrad, 0)] = encode("dout rows", v.dout_rows, 2, {H, P, 1}, {H * 2, 0}, box_a);
    m[map(Pass::kGrad, 1)] = encode("w2 (k-by-n)", t.w2, 3, {I, H, El}, {I * 2, H * I * 2}, box_mn);
    m[map(Pass::kDx, 0)] = encode("d13 rows", v.d13_rows, 2, {2 * I, P, 1}, {4 * I, 0}, box_a);
    m[map(Pass::kDx, 1)] = encode("w13 (k-by-n)", t.w13, 3, {H, 2 * I, El}, {H * 2, 2 * I * H * 2}, box_mn);
    m[map(Pass::kWeightGrad13, 0)] = encode("d13 rows (mn)", v.d13_rows, 2, {2 * I, P, 1}, {4 * I, 0}, box_mn);
    m[map(Pass::kWeightGrad13, 1)] = encode("x rows (mn)", v.x_rows, 2, {H, P, 1}, {H * 2, 0}, box_mn);
    m[map(Pass::kWeightGrad2, 0)] = encode("dout rows (mn)", v.dout_rows, 2, {H, P, 1}, {H * 2, 0}, box_mn);
    m[map(Pass::kWeightGrad2, 1)] = encode("w h rows (mn)", v.hw_rows, 2, {I, P, 1}, {I * 2, 0}, box_mn);
    // dx_j by schedule row, stored by TMA in [64 rows][64 columns] boxes.
    const std::array<cuuint32_t, 3> box_out{64, 64, 1};
    m[static_cast<size_t>(protocol::output_map<Pass>(protocol::Tensor::kDxRows))] =
        encode("dx rows", v.dx_rows, 2, {H, P, 1}, {H * 2, 0}, box_out);
    if (bf16_grads) {  // the weight gradients' tiles, stored by TMA in the same boxes
      auto out_map = [&](protocol::Tensor out) -> CUtensorMap& {
        return m[static_cast<size_t>(protocol::output_map<Pass>(out))];
      };
      out_map(protocol::Tensor::kWeightGrad13) = encode("dw13 (bf16)", t.dw13, 2, {H, El * 2 * I, 1}, {H * 2, 0}, box_out);
      out_map(protocol::Tensor::kWeightGrad2) = encode("dw2 (bf16)", t.dw2, 2, {I, El * H, 1}, {I * 2, 0}, box_out);
      if (S > 0) {
        out_map(protocol::Tensor::kSharedWeightGrad13) =
            encode("dshared_w13 (bf16)", t.dshared_w13, 2, {H, 2 * S, 1}, {H * 2, 0}, box_out);
        out_map(protocol::Tensor::kSharedWeightGrad2) =
            encode("dshared_w2 (bf16)", t.dshared_w2, 2, {S, H, 1}, {S * 2, 0}, box_out);
      }
    }
    if (S > 0 && T > 0) {
      m[map(Pass::kSharedGrad, 0)] = encode("dout", t.dout, 2, {H, T, 1}, {H * 2, 0}, box_a);
      m[map(Pass::kSharedGrad, 1)] =
          encode("shared w2 (k-by-n)", t.shared_w2, 3, {S, H, 1}, {S * 2, H * S * 2}, box_mn);
      m[map(Pass::kSharedDx, 0)] = encode("shared d13", v.shared_d13, 2, {2 * S, T_pad, 1}, {4 * S, 0}, box_a);
      m[map(Pass::kSharedDx, 1)] =
          encode("shared w13 (k-by-n)", t.shared_w13, 3, {H, 2 * S, 1}, {H * 2, 2 * S * H * 2}, box_mn);
      // The shared expert's weight gradients, over the tokens (K): dW13 =
      // shared d13^T x, dW2 = dout^T shared h (a rank without tokens stores
      // zeros and reads nothing).
      m[map(Pass::kSharedWeightGrad13, 0)] =
          encode("shared d13 (mn)", v.shared_d13, 2, {2 * S, T_pad, 1}, {4 * S, 0}, box_mn);
      m[map(Pass::kSharedWeightGrad13, 1)] = encode("x (mn)", t.x, 2, {H, T, 1}, {H * 2, 0}, box_mn);
      m[map(Pass::kSharedWeightGrad2, 0)] = encode("dout (mn)", t.dout, 2, {H, T, 1}, {H * 2, 0}, box_mn);
      m[map(Pass::kSharedWeightGrad2, 1)] =
          encode("shared h (mn)", v.shared_h, 2, {S, T_pad, 1}, {S * 2, 0}, box_mn);
    }
    if constexpr (std::is_same_v<Pass, protocol::BackwardRecomputePass>) {
      // The recomputed gate/up: x rows (and x) against W13 as the forward reads it.
      m[map(Pass::kRecompute, 0)] = encode("x rows", v.x_rows, 2, {H, P, 1}, {H * 2, 0}, box_a);
      m[map(Pass::kRecompute, 1)] = encode_gate_up("w13 (gate/up)", t.w13, H, I, El);
      if (S > 0 && T > 0) {
        m[map(Pass::kSharedRecompute, 0)] = encode("x", t.x, 2, {H, T, 1}, {H * 2, 0}, box_a);
        m[map(Pass::kSharedRecompute, 1)] = encode_gate_up("shared w13 (gate/up)", t.shared_w13, H, S, 1);
      }
    }
  }
  });

  return maps;
}

}  // namespace mok::world
