// The arithmetic of one SwiGLU FFN row, written once for the CPU reference's
// forward and backward (backward recomputes the forward activations with these
// very functions, so the two can never disagree).
//
// The scalar type is the precision policy:
//   float  = RefPrecision::kFP32: fp32 math, rounding to bf16 exactly where the
//            kernels store bf16 (h and y; see store()).
//   double = RefPrecision::kFP64: fp64 math, no rounding anywhere.
//
// Every sum runs in ascending index order with one accumulator, so a result
// depends only on its inputs, never on which thread computes it. Products and
// sums are separate operations (no FMA) except where the spec says fma; that
// assumes the compiler does not contract a * b + c on its own (true for the
// x86-64 baseline target; -ffp-contract=off makes it true everywhere).
#pragma once

#include <cmath>
#include <cstdint>

#include "mok/bf16.hpp"
#include "mok/fp8.hpp"

namespace mok::ref {

// A value as the kernels store it: bf16 in kFP32, untouched in kFP64.
inline float store(float value) { return round_to_bf16(value); }
inline double store(double value) { return value; }

template <typename T>
T sigmoid(T g) {
  return T(1) / (T(1) + std::exp(-g));
}

// silu(g) = g * sigmoid(g), written as the kernels write it: g / (1 + exp(-g)).
template <typename T>
T silu(T g) {
  return g / (T(1) + std::exp(-g));
}

// d silu / dg = s * (1 + g * (1 - s)) with s = sigmoid(g).
template <typename T>
T silu_grad(T g) {
  const T s = sigmoid(g);
  return s * (T(1) + g * (T(1) - s));
}

// sum_i a[i] * b[i], i ascending, in T.
template <typename T, typename B>
T dot(const float* a, const B* b, int n) {
  T acc = T(0);
  for (int i = 0; i < n; ++i) acc += T(a[i]) * T(b[i]);
  return acc;
}

// One FFN's weights in the nn.Linear layout: a routed expert (width F = I) or
// the fused shared expert (F = S).
struct FfnWeights {
  const float* w13;  // [2F, H]: rows [0, F) gate, [F, 2F) up
  const float* w2;   // [H, F]
  int hidden;        // H
  int width;         // F
};

// Forward of one row x [H]: g = W_gate x, u = W_up x (each [F]),
// h = store(silu(g) * u), and, when y is not null, y = store(W_down h) [H].
// g and u are kept (unrounded) because backward needs them.
template <typename T>
void ffn_forward_row(const FfnWeights& w, const float* x, T* g, T* u, T* h, T* y) {
  const int H = w.hidden;
  const int F = w.width;
  for (int i = 0; i < F; ++i) {
    g[i] = dot<T>(w.w13 + static_cast<int64_t>(i) * H, x, H);
    u[i] = dot<T>(w.w13 + static_cast<int64_t>(F + i) * H, x, H);
    h[i] = store(silu(g[i]) * u[i]);
  }
  if (y == nullptr) return;
  for (int n = 0; n < H; ++n) y[n] = store(dot<T>(w.w2 + static_cast<int64_t>(n) * F, h, F));
}

// The FP8 forward of one routed row (config.dtype kFP8E4M3): x and the
// weights are the block-dequantized ones (x 1 x 128, weights 128 x 128), g and
// u dot products in fp32, h = silu(g) * u in fp32 quantized to e4m3 in 1 x 128
// blocks of the row (what the gate/up epilogue hands the down GEMM), y =
// bf16(W_down h). F must be a multiple of 128.
inline void ffn_forward_row_fp8(const FfnWeights& w, const float* x, float* g, float* u, float* h, float* y) {
  const int H = w.hidden;
  const int F = w.width;
  for (int i = 0; i < F; ++i) {
    g[i] = dot<float>(w.w13 + static_cast<int64_t>(i) * H, x, H);
    u[i] = dot<float>(w.w13 + static_cast<int64_t>(F + i) * H, x, H);
    h[i] = silu(g[i]) * u[i];
  }
  for (int b = 0; b < F; b += fp8::kBlock) {
    float amax = 0.0f;
    for (int i = b; i < b + fp8::kBlock; ++i) amax = std::fmax(amax, std::fabs(h[i]));
    const int32_t e = fp8::scale_exponent(amax);
    for (int i = b; i < b + fp8::kBlock; ++i) h[i] = std::ldexp(fp8::decode_e4m3(fp8::encode_e4m3(std::ldexp(h[i], -e))), e);
  }
  for (int n = 0; n < H; ++n) y[n] = store(dot<float>(w.w2 + static_cast<int64_t>(n) * F, h, F));
}

// Backward of one row through the FFN, given its recomputed g, u and the
// gradient dy [H] of its output (already multiplied by the routing weight):
//   dh  = W_down^T dy                         [F]  (scratch)
//   d13 = [dh * u * silu'(g) ; dh * silu(g)]  [2F] (gate part, then up part)
//   dx  = W13^T d13                           [H]
// Each transposed product walks the weight matrix row by row, which keeps the
// sum for every output element in ascending order of the reduced index.
template <typename T>
void ffn_backward_row(const FfnWeights& w, const T* g, const T* u, const T* dy, T* dh, T* d13,
                      T* dx) {
  const int H = w.hidden;
  const int F = w.width;
  for (int i = 0; i < F; ++i) dh[i] = T(0);
  for (int n = 0; n < H; ++n) {
    const float* w2_row = w.w2 + static_cast<int64_t>(n) * F;
    for (int i = 0; i < F; ++i) dh[i] += T(w2_row[i]) * dy[n];
  }
  for (int i = 0; i < F; ++i) {
    d13[i] = dh[i] * u[i] * silu_grad(g[i]);
    d13[F + i] = dh[i] * silu(g[i]);
  }
  for (int n = 0; n < H; ++n) dx[n] = T(0);
  for (int r = 0; r < 2 * F; ++r) {
    const float* w13_row = w.w13 + static_cast<int64_t>(r) * H;
    for (int n = 0; n < H; ++n) dx[n] += T(w13_row[n]) * d13[r];
  }
}

}  // namespace mok::ref
