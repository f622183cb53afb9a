// Backward pass of the CPU reference.
//
// Every FFN (each routed expert, then the shared expert) runs over its rows in
// the order its weight gradients must sum: an expert's rows in schedule order
// (global token order), the shared expert's tokens in global order. Each row
// recomputes its forward activations with the forward's own helpers, then
// leaves its dx contribution (and, for routed rows, d weight) in a slot of its
// own. The home rank finally sums dx per token: shared part first, then slots
// 0..k-1, like the forward combine.
#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "mok/error.hpp"
#include "reference/reference_common.hpp"

namespace mok {
namespace {

// One row of backward work through one FFN.
template <typename T>
struct GradRow {
  const float* x;     // [H] the row's input
  const float* dout;  // [H] gradient of the home token's out
  T scale;            // routing weight of the row; 1 for the shared expert
  T* dx;              // [H] receives this row's contribution to dx
  T* dweight;         // receives d loss / d scale; null for the shared expert
};

// Rows are taken in chunks so that the per-row intermediates the weight
// gradients need (h, dy, d13) stay small whatever the token count. Chunking
// does not change the order of any sum: each weight-gradient element keeps
// one accumulator across chunks and adds the rows in order.
constexpr int64_t kRowsPerChunk = 128;

// Backward of rows[] through FFN `w`, adding the weight gradients into
// dw13 [2F, H] and dw2 [H, F] in row order.
template <typename T>
void ffn_backward(const ref::FfnWeights& w, std::span<const GradRow<T>> rows, T* dw13, T* dw2,
                  int threads) {
  const int H = w.hidden;
  const int F = w.width;
  std::vector<T> h_chunk(kRowsPerChunk * F), dy_chunk(kRowsPerChunk * H),
      d13_chunk(kRowsPerChunk * 2 * F);
  const int64_t total = static_cast<int64_t>(rows.size());
  for (int64_t first = 0; first < total; first += kRowsPerChunk) {
    const int64_t count = std::min(kRowsPerChunk, total - first);

    // Per row: recompute, then back through the FFN. Rows write disjoint data.
    ref::parallel_for(threads, count, [&](int64_t begin, int64_t end) {
      std::vector<T> g(F), u(F), dh(F), y(H);
      for (int64_t i = begin; i < end; ++i) {
        const GradRow<T>& row = rows[first + i];
        T* h = h_chunk.data() + i * F;
        T* dy = dy_chunk.data() + i * H;
        T* d13 = d13_chunk.data() + i * 2 * F;
        const bool routed = row.dweight != nullptr;
        ref::ffn_forward_row(w, row.x, g.data(), u.data(), h, routed ? y.data() : nullptr);
        if (routed) *row.dweight = ref::dot<T>(row.dout, y.data(), H);
        for (int c = 0; c < H; ++c) dy[c] = row.scale * T(row.dout[c]);
        ref::ffn_backward_row(w, g.data(), u.data(), dy, dh.data(), d13, row.dx);
      }
    });

    // Weight gradients, one output row per work item: dw13 rows [0, 2F) get
    // d13 (outer) x, dw2 rows get dy (outer) h, each summed over rows in order.
    ref::parallel_for(threads, 2 * F + H, [&](int64_t begin, int64_t end) {
      for (int64_t out_row = begin; out_row < end; ++out_row) {
        if (out_row < 2 * F) {
          T* acc = dw13 + out_row * H;
          for (int64_t i = 0; i < count; ++i) {
            const T a = d13_chunk[i * 2 * F + out_row];
            const float* x = rows[first + i].x;
            for (int c = 0; c < H; ++c) acc[c] += a * T(x[c]);
          }
        } else {
          const int64_t n = out_row - 2 * F;
          T* acc = dw2 + n * F;
          for (int64_t i = 0; i < count; ++i) {
            const T a = dy_chunk[i * H + n];
            const T* h = h_chunk.data() + i * F;
            for (int c = 0; c < F; ++c) acc[c] += a * h[c];
          }
        }
      }
    });
  }
}

void validate_dout(const LayerConfig& config, std::span<const float* const> dout) {
  if (static_cast<int>(dout.size()) != config.world_size) {
    throw Error("reference: dout has " + std::to_string(dout.size()) + " ranks; world_size is " +
                std::to_string(config.world_size));
  }
  for (int r = 0; r < config.world_size; ++r) {
    if (config.tokens_per_rank[r] > 0 && dout[r] == nullptr) {
      throw Error("reference: dout of rank " + std::to_string(r) + " is null but it has " +
                  std::to_string(config.tokens_per_rank[r]) + " tokens");
    }
  }
}

template <typename T>
ReferenceBackward backward_in(const LayerInputs& inputs, const WorldSchedule& schedule,
                              std::span<const float* const> dout, int threads) {
  const LayerConfig& config = inputs.config;
  const int R = config.world_size;
  const int64_t H = config.hidden;
  const int64_t I = config.intermediate;
  const int64_t S = config.shared_width();
  const int k = config.top_k;

  // Per (token, slot) and per token results, in T until the end.
  std::vector<std::vector<T>> dx_slot(R), dx_shared(R), dweights(R);
  for (int r = 0; r < R; ++r) {
    const int64_t tokens = config.tokens_per_rank[r];
    dx_slot[r].assign(tokens * k * H, T(0));
    dx_shared[r].assign(tokens * H, T(0));
    dweights[r].assign(tokens * k, T(0));
  }
  std::vector<T> dw13(config.num_experts * 2 * I * H, T(0));
  std::vector<T> dw2(config.num_experts * H * I, T(0));
  std::vector<T> dshared_w13(2 * S * H, T(0));
  std::vector<T> dshared_w2(H * S, T(0));

  // Routed experts, each over its rows in schedule order.
  std::vector<GradRow<T>> rows;
  for (int e = 0; e < config.num_experts; ++e) {
    rows.clear();
    for (const RowSource& src : ref::expert_rows(schedule, config, e)) {
      const int64_t entry = static_cast<int64_t>(src.token) * k + src.slot;
      rows.push_back({inputs.x[src.rank] + src.token * H, dout[src.rank] + src.token * H,
                      T(inputs.routing[src.rank].weights[entry]),
                      dx_slot[src.rank].data() + entry * H, &dweights[src.rank][entry]});
    }
    ffn_backward<T>(ref::routed_weights(inputs, e), rows, dw13.data() + e * 2 * I * H,
                    dw2.data() + e * H * I, threads);
  }

  // The shared expert over all tokens in global order, weight 1.
  if (S > 0) {
    rows.clear();
    for (int r = 0; r < R; ++r) {
      for (int64_t t = 0; t < config.tokens_per_rank[r]; ++t) {
        rows.push_back({inputs.x[r] + t * H, dout[r] + t * H, T(1), dx_shared[r].data() + t * H,
                        nullptr});
      }
    }
    ffn_backward<T>(ref::shared_weights(inputs), rows, dshared_w13.data(), dshared_w2.data(),
                    threads);
  }

  ReferenceBackward result;
  result.dx.resize(R);
  result.dweights.resize(R);
  for (int r = 0; r < R; ++r) {
    const int64_t tokens = config.tokens_per_rank[r];
    result.dx[r].assign(tokens * H, 0.0);
    ref::parallel_for(threads, tokens, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t c = 0; c < H; ++c) {
          T acc = dx_shared[r][t * H + c];
          for (int j = 0; j < k; ++j) acc += dx_slot[r][(t * k + j) * H + c];
          result.dx[r][t * H + c] = acc;
        }
      }
    });
    result.dweights[r] = ref::to_double(dweights[r]);
  }
  result.dw13 = ref::to_double(dw13);
  result.dw2 = ref::to_double(dw2);
  result.dshared_w13 = ref::to_double(dshared_w13);
  result.dshared_w2 = ref::to_double(dshared_w2);
  return result;
}

}  // namespace

ReferenceBackward reference_backward(const LayerInputs& inputs, const WorldSchedule& schedule,
                                     std::span<const float* const> dout,
                                     const ReferenceOptions& options) {
  ref::validate_reference(inputs, schedule, options);
  validate_dout(inputs.config, dout);
  if (options.precision == RefPrecision::kFP32) {
    return backward_in<float>(inputs, schedule, dout, options.num_threads);
  }
  return backward_in<double>(inputs, schedule, dout, options.num_threads);
}

}  // namespace mok
