// Forward pass of the CPU reference, in the order the kernels work:
//   1. every receiver rank runs its experts' rows in schedule order and drops
//      each row's y at the (home rank, token, slot) the row names;
//   2. every home rank runs the shared expert on its tokens;
//   3. every home rank combines: out = store(fma chain over slots from s).
#include <cmath>
#include <type_traits>
#include <vector>

#include "mok/fp8.hpp"
#include "reference/reference_common.hpp"

namespace mok {
namespace {

// A real row of the schedule together with the expert that computes it.
struct RoutedRow {
  int expert;
  RowSource source;
};

// Receivers ascending, local experts ascending, rows in schedule order.
std::vector<RoutedRow> all_routed_rows(const LayerConfig& config, const WorldSchedule& schedule) {
  std::vector<RoutedRow> rows;
  rows.reserve(static_cast<size_t>(config.total_tokens() * config.top_k));
  for (int e = 0; e < config.num_experts; ++e) {
    for (const RowSource& row : ref::expert_rows(schedule, config, e)) rows.push_back({e, row});
  }
  return rows;
}

// The FP8 recipe's routed operands: every rank's x dequantized from 1 x 128
// blocks, every expert's w13 and w2 from 128 x 128 blocks (the shared expert
// stays bf16 and reads the original x).
struct Fp8Operands {
  std::vector<std::vector<float>> x;  // [R] of [T_r, H]
  std::vector<float> w13, w2;         // [E, 2I, H], [E, H, I]
};

std::vector<float> dequantized_weight(const float* w, int64_t groups, int64_t rows, int64_t cols) {
  const fp8::QuantizedWeight q =
      fp8::quantize_weight(std::span<const float>(w, static_cast<size_t>(groups * rows * cols)), groups, rows, cols);
  std::vector<float> out(q.values.size());
  const int64_t rb = rows / fp8::kBlock, cb = cols / fp8::kBlock;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = static_cast<size_t>((g * rows + r) * cols + c);
        const float scale = fp8::decode_ue8m0(q.scales[static_cast<size_t>((g * rb + r / fp8::kBlock) * cb + c / fp8::kBlock)]);
        out[i] = fp8::decode_e4m3(q.values[i]) * scale;
      }
    }
  }
  return out;
}

Fp8Operands fp8_operands(const LayerInputs& inputs) {
  const LayerConfig& c = inputs.config;
  const int64_t E = c.num_experts, H = c.hidden, I = c.intermediate;
  Fp8Operands op;
  op.w13 = dequantized_weight(inputs.w13, E, 2 * I, H);
  op.w2 = dequantized_weight(inputs.w2, E, H, I);
  for (int r = 0; r < c.world_size; ++r) {
    const int64_t T = c.tokens_per_rank[static_cast<size_t>(r)];
    std::vector<uint8_t> values(static_cast<size_t>(T * H)), scales(static_cast<size_t>(T * (H / fp8::kBlock)));
    op.x.emplace_back(static_cast<size_t>(T * H));
    if (T == 0) continue;
    fp8::quantize_rows(std::span<const float>(inputs.x[static_cast<size_t>(r)], static_cast<size_t>(T * H)), T, H,
                       values, scales);
    for (int64_t i = 0; i < T * H; ++i) {
      op.x.back()[static_cast<size_t>(i)] = fp8::decode_e4m3(values[static_cast<size_t>(i)]) *
                                           fp8::decode_ue8m0(scales[static_cast<size_t>(i / fp8::kBlock)]);
    }
  }
  return op;
}

template <typename T>
ReferenceForward forward_in(const LayerInputs& inputs, const WorldSchedule& schedule, int threads) {
  const LayerConfig& config = inputs.config;
  const int R = config.world_size;
  const int H = config.hidden;
  const int k = config.top_k;
  const int S = config.shared_width();

  ReferenceForward result;
  result.out.resize(R);
  result.expert_out.resize(R);
  result.shared_out.resize(R);
  for (int r = 0; r < R; ++r) {
    const size_t tokens = static_cast<size_t>(config.tokens_per_rank[r]);
    result.out[r].assign(tokens * H, 0.0);
    result.expert_out[r].assign(tokens * k * H, 0.0);
    result.shared_out[r].assign(tokens * H, 0.0);
  }

  // 1. Routed experts. Rows are independent and each writes its own
  // (rank, token, slot) entry, so any split over threads gives the same bits.
  const std::vector<RoutedRow> rows = all_routed_rows(config, schedule);
  const bool fp8 = config.dtype == DType::kFP8E4M3;
  const Fp8Operands quantized = fp8 ? fp8_operands(inputs) : Fp8Operands{};
  ref::parallel_for(threads, static_cast<int64_t>(rows.size()), [&](int64_t begin, int64_t end) {
    const int I = config.intermediate;
    std::vector<T> g(I), u(I), h(I), y(H);
    for (int64_t n = begin; n < end; ++n) {
      const RowSource& src = rows[n].source;
      if constexpr (std::is_same_v<T, float>) {
        if (fp8) {
          const int64_t e = rows[n].expert;
          const ref::FfnWeights w{quantized.w13.data() + e * 2 * I * H, quantized.w2.data() + e * H * I, H, I};
          ref::ffn_forward_row_fp8(w, quantized.x[src.rank].data() + static_cast<int64_t>(src.token) * H, g.data(),
                                   u.data(), h.data(), y.data());
          double* dst = result.expert_out[src.rank].data() + (static_cast<int64_t>(src.token) * k + src.slot) * H;
          for (int c = 0; c < H; ++c) dst[c] = y[c];
          continue;
        }
      }
      const float* x = inputs.x[src.rank] + static_cast<int64_t>(src.token) * H;
      ref::ffn_forward_row(ref::routed_weights(inputs, rows[n].expert), x, g.data(), u.data(),
                           h.data(), y.data());
      double* dst = result.expert_out[src.rank].data() +
                    (static_cast<int64_t>(src.token) * k + src.slot) * H;
      for (int c = 0; c < H; ++c) dst[c] = y[c];
    }
  });

  // 2 and 3, per home token: shared expert, then the combine in slot order.
  std::vector<int64_t> first_token(R + 1, 0);  // global index of each rank's token 0
  for (int r = 0; r < R; ++r) first_token[r + 1] = first_token[r] + config.tokens_per_rank[r];
  ref::parallel_for(threads, first_token[R], [&](int64_t begin, int64_t end) {
    std::vector<T> g(S), u(S), hs(S), s(H, T(0));
    int r = 0;
    for (int64_t global = begin; global < end; ++global) {
      while (global >= first_token[r + 1]) ++r;
      const int64_t t = global - first_token[r];
      const float* x = inputs.x[r] + t * H;
      if (S > 0) {
        ref::ffn_forward_row(ref::shared_weights(inputs), x, g.data(), u.data(), hs.data(),
                             s.data());
      }
      const float* w = inputs.routing[r].weights + t * k;
      const double* y = result.expert_out[r].data() + t * k * H;
      for (int c = 0; c < H; ++c) {
        T acc = s[c];
        // expert_out holds T values widened to double: narrowing back is exact.
        for (int j = 0; j < k; ++j) acc = std::fma(T(w[j]), static_cast<T>(y[j * H + c]), acc);
        result.shared_out[r][t * H + c] = s[c];
        result.out[r][t * H + c] = ref::store(acc);
      }
    }
  });
  return result;
}

}  // namespace

ReferenceForward reference_forward(const LayerInputs& inputs, const WorldSchedule& schedule,
                                   const ReferenceOptions& options) {
  ref::validate_reference(inputs, schedule, options, /*fp8_allowed=*/true);
  if (options.precision == RefPrecision::kFP32) {
    return forward_in<float>(inputs, schedule, options.num_threads);
  }
  return forward_in<double>(inputs, schedule, options.num_threads);
}

}  // namespace mok
