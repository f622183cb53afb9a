// The backward's GPU building blocks composed as the fused backward will run
// them (docs/backward-design.md), checked against the CPU reference backward
// (src/reference) and for the invariance the design promises.
//
// Per owner rank, over its schedule (mok::build_schedule: each local expert's
// rows in global token order, padded to 128):
//   [gate | up] = x rows . W13^T            grouped GEMM (the recompute)
//   d13, w h, d w = SwiGLU backward          grouped GEMM, W2 read k-by-n
//   dx_j = d13 . W13                         grouped GEMM, W13 read k-by-n
//   dW13 = d13^T x rows, dW2 = dout^T (w h)  weight-gradient GEMM
// then, per home rank: the shared expert the same way (one group, weight 1),
// and dx = shared + slots in order (row_combine). The host only moves rows
// (what the dispatch and the home-row stores will do in the kernel).
//
// Checks: every gradient against the reference for R in {1, 2, 4, 8}; dx, d w,
// dW13 and dW2 the same bits for every R (the shared expert's weight
// gradients are per-rank parts: their sum is checked).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu/gemm_test_support.hpp"
#include "gpu/gpu_test_env.hpp"
#include "mok/bf16.hpp"
#include "mok/grouped_gemm.hpp"
#include "mok/presets.hpp"
#include "mok/reference.hpp"
#include "mok/row_combine.hpp"
#include "mok/schedule.hpp"
#include "mok/synthetic.hpp"
#include "mok/weight_grad.hpp"

namespace {

using mok::gemm_test::DeviceBuffer;

std::vector<uint16_t> to_bf16(const float* p, size_t n) {
  std::vector<uint16_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = mok::float_to_bf16_bits(p[i]);
  return out;
}

// out = a . b (plain epilogue; b [G, n, k], or [G, k, n] with kKN).
void gemm(const DeviceBuffer<uint16_t>& a, const DeviceBuffer<uint16_t>& b, DeviceBuffer<uint16_t>& out,
          const DeviceBuffer<int32_t>& offset, const DeviceBuffer<int32_t>& rows, int groups, int64_t m, int64_t n,
          int64_t k, mok::WeightLayout layout) {
  mok::GroupedGemmArgs args;
  args.a = a.get();
  args.b = b.get();
  args.out = out.get();
  args.group_offset = offset.get();
  args.group_rows = rows.get();
  args.num_groups = groups;
  args.m_total = m;
  args.n = n;
  args.k = k;
  args.b_layout = layout;
  mok::grouped_gemm(args);
}

struct FfnGrads {
  std::vector<uint16_t> dx_rows;  // [m, H] bf16 per row
  std::vector<float> dscale;      // [m] (routed only)
  std::vector<float> dw13, dw2;   // [G, 2F, H], [G, H, F]
};

// The backward of `groups` FFNs of width F over rows in schedule order.
FfnGrads ffn_backward(const std::vector<uint16_t>& x_rows, const std::vector<uint16_t>& dout_rows,
                      const std::vector<float>* scale, const std::vector<uint16_t>& w13,
                      const std::vector<uint16_t>& w2, const std::vector<int32_t>& offset,
                      const std::vector<int32_t>& rows, int64_t H, int64_t F) {
  const int G = static_cast<int>(rows.size());
  const int64_t m = static_cast<int64_t>(x_rows.size()) / H;
  FfnGrads g;
  if (m == 0) {
    g.dw13.assign(static_cast<size_t>(G * 2 * F * H), 0.0f);
    g.dw2.assign(static_cast<size_t>(G * H * F), 0.0f);
    return g;
  }
  DeviceBuffer<uint16_t> x(x_rows), dout(dout_rows), d_w13(w13), d_w2(w2);
  DeviceBuffer<int32_t> d_offset(offset), d_rows(rows);
  DeviceBuffer<uint16_t> preact(static_cast<size_t>(m * 2 * F)), d13(static_cast<size_t>(m * 2 * F)),
      hw(static_cast<size_t>(m * F)), dx(static_cast<size_t>(m * H));
  DeviceBuffer<float> dscale(static_cast<size_t>(m)),
      scratch(static_cast<size_t>(m * mok::swiglu_backward_parts(F))), dw13(static_cast<size_t>(G * 2 * F * H)),
      dw2(static_cast<size_t>(G * H * F));
  std::unique_ptr<DeviceBuffer<float>> d_scale;
  if (scale != nullptr) d_scale = std::make_unique<DeviceBuffer<float>>(*scale);
  gemm(x, d_w13, preact, d_offset, d_rows, G, m, 2 * F, H, mok::WeightLayout::kNK);
  mok::GroupedGemmArgs s;
  s.a = dout.get();
  s.b = d_w2.get();
  s.out = d13.get();
  s.group_offset = d_offset.get();
  s.group_rows = d_rows.get();
  s.num_groups = G;
  s.m_total = m;
  s.n = F;
  s.k = H;
  s.epilogue = mok::GemmEpilogue::kSwiGLUBackward;
  s.b_layout = mok::WeightLayout::kKN;
  s.preact = preact.get();
  s.row_scale = d_scale ? d_scale->get() : nullptr;
  s.scaled_act = hw.get();
  s.row_scale_grad = dscale.get();
  s.scratch = scratch.get();
  mok::grouped_gemm(s);
  gemm(d13, d_w13, dx, d_offset, d_rows, G, m, H, 2 * F, mok::WeightLayout::kKN);
  for (auto [a, b, out, mm, nn] : {std::tuple{&d13, &x, &dw13, 2 * F, H}, std::tuple{&dout, &hw, &dw2, H, F}}) {
    mok::WeightGradArgs w;
    w.a = a->get();
    w.b = b->get();
    w.out = out->get();
    w.group_offset = d_offset.get();
    w.group_rows = d_rows.get();
    w.num_groups = G;
    w.m_total = m;
    w.m = mm;
    w.n = nn;
    mok::grouped_weight_grad(w);
  }
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  g.dx_rows = dx.download();
  g.dscale = dscale.download();
  g.dw13 = dw13.download();
  g.dw2 = dw2.download();
  return g;
}

struct Grads {
  std::vector<uint16_t> dx;          // all ranks' tokens, in order
  std::vector<float> dweights;       // [T, k]
  std::vector<float> dw13, dw2;      // every expert, in order
  std::vector<double> dsw13, dsw2;   // the shared expert's, summed over ranks
};

Grads composed_backward(const mok::LayerConfig& config, const mok::synthetic::Layer& layer,
                        const std::vector<std::vector<float>>& dout) {
  const int R = config.world_size, k = config.top_k, El = config.experts_per_rank();
  const int64_t H = config.hidden, I = config.intermediate, S = config.shared_width();
  const auto schedule = mok::build_schedule(config, layer.routing(), {128, 1});
  std::vector<std::vector<uint16_t>> x(R), dy(R), slot_rows(R);
  for (int r = 0; r < R; ++r) {
    const size_t T = static_cast<size_t>(config.tokens_per_rank[r]);
    x[r] = to_bf16(layer.x[r].data(), T * H);
    dy[r] = to_bf16(dout[r].data(), T * H);
    slot_rows[r].assign(T * k * H, 0);
  }
  std::vector<std::vector<float>> dweights(R);
  for (int r = 0; r < R; ++r) dweights[r].assign(static_cast<size_t>(config.tokens_per_rank[r]) * k, 0.0f);
  Grads out;
  for (int r = 0; r < R; ++r) {  // owner r
    const mok::RankSchedule& rs = schedule.ranks[r];
    const int64_t P = rs.padded_rows();
    std::vector<uint16_t> x_rows(static_cast<size_t>(P * H), 0), dout_rows(static_cast<size_t>(P * H), 0);
    std::vector<float> w_rows(static_cast<size_t>(P), 0.0f);
    for (int64_t i = 0; i < P; ++i) {
      const mok::RowSource src = rs.rows[i];
      if (src.rank == mok::kPaddingRank) continue;
      std::copy_n(&x[src.rank][src.token * H], H, &x_rows[i * H]);
      std::copy_n(&dy[src.rank][src.token * H], H, &dout_rows[i * H]);
      w_rows[i] = layer.weights[src.rank][src.token * k + src.slot];
    }
    const size_t first = static_cast<size_t>(r) * El;
    const auto w13 = to_bf16(layer.w13.data() + first * 2 * I * H, El * 2 * I * H);
    const auto w2 = to_bf16(layer.w2.data() + first * H * I, El * H * I);
    const FfnGrads g = ffn_backward(x_rows, dout_rows, &w_rows, w13, w2, rs.expert_offset, rs.expert_rows, H, I);
    for (int64_t i = 0; i < P; ++i) {
      const mok::RowSource src = rs.rows[i];
      if (src.rank == mok::kPaddingRank) continue;
      std::copy_n(&g.dx_rows[i * H], H, &slot_rows[src.rank][(src.token * k + src.slot) * H]);
      dweights[src.rank][src.token * k + src.slot] = g.dscale[i];
    }
    out.dw13.insert(out.dw13.end(), g.dw13.begin(), g.dw13.end());
    out.dw2.insert(out.dw2.end(), g.dw2.begin(), g.dw2.end());
  }
  out.dsw13.assign(static_cast<size_t>(2 * S * H), 0.0);
  out.dsw2.assign(static_cast<size_t>(H * S), 0.0);
  for (int r = 0; r < R; ++r) {  // home r
    const int32_t T = config.tokens_per_rank[r];
    std::vector<uint16_t> shared_dx;
    if (S > 0) {
      const FfnGrads g = ffn_backward(x[r], dy[r], nullptr, to_bf16(layer.shared_w13.data(), 2 * S * H),
                                      to_bf16(layer.shared_w2.data(), H * S), {0, T}, {T}, H, S);
      shared_dx = g.dx_rows;
      for (size_t i = 0; i < g.dw13.size(); ++i) out.dsw13[i] += g.dw13[i];
      for (size_t i = 0; i < g.dw2.size(); ++i) out.dsw2[i] += g.dw2[i];
    }
    if (T == 0) continue;
    std::vector<int32_t> index(static_cast<size_t>(T) * k);
    for (size_t i = 0; i < index.size(); ++i) index[i] = static_cast<int32_t>(i);
    DeviceBuffer<uint16_t> rows(slot_rows[r]), dx(static_cast<size_t>(T) * H);
    DeviceBuffer<int32_t> d_index(index);
    std::unique_ptr<DeviceBuffer<uint16_t>> base;
    if (S > 0) base = std::make_unique<DeviceBuffer<uint16_t>>(shared_dx);
    mok::RowCombineArgs c;
    c.rows = rows.get();
    c.row_index = d_index.get();
    c.base = base ? base->get() : nullptr;
    c.out = dx.get();
    c.num_rows = static_cast<int64_t>(T) * k;
    c.tokens = T;
    c.k = k;
    c.width = H;
    mok::row_combine(c);
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
    const auto d = dx.download();
    out.dx.insert(out.dx.end(), d.begin(), d.end());
    out.dweights.insert(out.dweights.end(), dweights[r].begin(), dweights[r].end());
  }
  return out;
}

double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

template <typename T>
std::vector<double> as_double(const std::vector<T>& v) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<T, uint16_t>) {
      d[i] = mok::bf16_bits_to_float(v[i]);
    } else {
      d[i] = v[i];
    }
  }
  return d;
}

std::vector<double> flatten(const std::vector<std::vector<double>>& v) {
  std::vector<double> out;
  for (const auto& part : v) out.insert(out.end(), part.begin(), part.end());
  return out;
}

TEST(BackwardComposition, MatchesTheReferenceAndKeepsItsBitsAtEveryWorldSize) {
  MOK_REQUIRE_HOPPER();
  for (const char* preset : {"small", "no-shared"}) {
    SCOPED_TRACE(preset);
    std::vector<Grads> by_world;
    for (int R : {1, 2, 4, 8}) {
      SCOPED_TRACE("R = " + std::to_string(R));
      const auto config = mok::make_config(mok::find_shape(preset), R, 256 / R);
      const auto layer = mok::synthetic::make_layer(config, 41, mok::synthetic::RoutingMode::kSkewed);
      const auto dout = mok::synthetic::random_dout(config, 42);
      const Grads got = composed_backward(config, layer, dout);
      const auto schedule = mok::build_schedule(config, layer.routing(), {128, 1});
      mok::ReferenceOptions options;
      options.num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      const auto ref = mok::reference_backward(layer.inputs(), schedule, mok::synthetic::rank_pointers(dout), options);
      EXPECT_LT(relative_error(as_double(got.dx), flatten(ref.dx)), 2e-2) << "dx";
      EXPECT_LT(relative_error(as_double(got.dweights), flatten(ref.dweights)), 2e-2) << "d weights";
      EXPECT_LT(relative_error(as_double(got.dw13), ref.dw13), 2e-2) << "dW13";
      EXPECT_LT(relative_error(as_double(got.dw2), ref.dw2), 2e-2) << "dW2";
      if (config.shared_width() > 0) {
        EXPECT_LT(relative_error(got.dsw13, ref.dshared_w13), 2e-2) << "shared dW13";
        EXPECT_LT(relative_error(got.dsw2, ref.dshared_w2), 2e-2) << "shared dW2";
      }
      by_world.push_back(got);
    }
    for (size_t i = 1; i < by_world.size(); ++i) {
      EXPECT_EQ(by_world[i].dx, by_world[0].dx) << "dx bits, world " << (1 << i);
      EXPECT_EQ(by_world[i].dweights, by_world[0].dweights) << "d weights bits, world " << (1 << i);
      EXPECT_EQ(by_world[i].dw13, by_world[0].dw13) << "dW13 bits, world " << (1 << i);
      EXPECT_EQ(by_world[i].dw2, by_world[0].dw2) << "dW2 bits, world " << (1 << i);
    }
  }
}

}  // namespace
