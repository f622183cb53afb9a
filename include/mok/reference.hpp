// The CPU reference of one MoE layer over a whole EP world: the executable
// specification that every kernel is checked against.
//
//   out[t] = shared(x[t]) + sum_{j<k} w[t][j] * expert_{ids[t][j]}(x[t])
//   expert(x) = down(silu(gate x) * up x)
//
// It walks the same WorldSchedule the kernels walk (rows of each expert in
// schedule order), so a schedule bug shows up here too.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mok/layer_config.hpp"
#include "mok/routing.hpp"
#include "mok/schedule.hpp"

namespace mok {

enum class RefPrecision {
  // fp32 math on the given inputs, rounding to bf16 exactly where the kernels
  // store bf16: the SwiGLU activation h, each expert's output row y, the shared
  // expert's activation and output, and `out`. The weighted sum over slots is
  // acc = s; acc = fmaf(w_j, y_j, acc) for j = 0..k-1, in fp32. Backward runs
  // in fp32 from those rounded activations with no further rounding.
  kFP32,
  // fp64 math and no rounding anywhere: the mathematical function, used to
  // check kFP32 and as the target of finite differences.
  kFP64,
};

// An fp8 layer (config.dtype kFP8E4M3; forward only, H and I multiples of
// 128) computes the FP8 recipe in kFP32: each rank's x quantized in 1 x 128
// blocks, each expert's w13 and w2 in 128 x 128 blocks (include/mok/fp8.hpp,
// bit-exact), the routed experts' g and u in fp32 over those dequantized
// values, h = silu(g) * u in fp32 quantized in 1 x 128 blocks of its row,
// y = bf16(W_down h); the shared expert and the combine exactly as in bf16.
// The kernels' FP8 GEMMs sum in another order (promotion every 128 of K), so
// they match it within tolerance, not bit for bit.

// Host copies of every input, as floats (pass bf16-rounded values to mirror a
// bf16 run). Weights use the nn.Linear layout [out_features, in_features], so
// the reduction dimension is contiguous for every forward GEMM.
struct LayerInputs {
  LayerConfig config;
  std::vector<const float*> x;       // [R] of [T_r, H]
  std::vector<RankRouting> routing;  // [R]
  const float* w13 = nullptr;        // [E, 2I, H]: rows [0, I) gate, [I, 2I) up
  const float* w2 = nullptr;         // [E, H, I]
  const float* shared_w13 = nullptr; // [2S, H] with S = config.shared_width(); null when S == 0
  const float* shared_w2 = nullptr;  // [H, S]
};

struct ReferenceOptions {
  RefPrecision precision = RefPrecision::kFP32;
  int num_threads = 1;  // never changes a result bit
};

struct ReferenceForward {
  std::vector<std::vector<double>> out;         // [R] of [T_r, H]
  std::vector<std::vector<double>> expert_out;  // [R] of [T_r, k, H]: y per (token, slot)
  std::vector<std::vector<double>> shared_out;  // [R] of [T_r, H]; zeros when S == 0
};

struct ReferenceBackward {
  std::vector<std::vector<double>> dx;        // [R] of [T_r, H]
  std::vector<std::vector<double>> dweights;  // [R] of [T_r, k]
  std::vector<double> dw13;                   // [E, 2I, H]
  std::vector<double> dw2;                    // [E, H, I]
  std::vector<double> dshared_w13;            // [2S, H]
  std::vector<double> dshared_w2;             // [H, S]
};

// Both validate config, routing (with weights) and that the schedule matches
// them, then compute. Weight gradients sum over an expert's rows in schedule
// order, which is global token order.
ReferenceForward reference_forward(const LayerInputs& inputs, const WorldSchedule& schedule,
                                   const ReferenceOptions& options = {});
// dout: [R] of [T_r, H], the gradient of the loss with respect to out.
ReferenceBackward reference_backward(const LayerInputs& inputs, const WorldSchedule& schedule,
                                     std::span<const float* const> dout,
                                     const ReferenceOptions& options = {});

// How far bf16 outputs (every rank's, concatenated in rank order) are from a
// reference's per-rank values: ||out - ref|| / ||ref|| over all of them. An
// unwritten (NaN) output counts as a huge error; a size mismatch throws
// mok::Error. The one comparison mok_cli and the GPU tests use.
double relative_l2_error(std::span<const uint16_t> out_bf16, const std::vector<std::vector<double>>& reference);

}  // namespace mok
