// The fused forward's training mode (RankTensors::preact / shared_preact):
// the output is the same bits as without it, and the kept gate/up
// pre-activations are the bits the grouped GEMM recomputes from the same rows
// and weights -- so a backward reading them (save mode) and one recomputing
// them (recompute mode) see the same values. Buffers are poisoned first:
// padding rows must stay untouched.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu_test_env.hpp"
#include "mok/bf16.hpp"
#include "mok/device_layer.hpp"
#include "mok/error.hpp"
#include "mok/fused_forward.hpp"
#include "mok/grouped_gemm.hpp"
#include "mok/presets.hpp"
#include "mok/schedule.hpp"
#include "mok/synthetic.hpp"

namespace {

constexpr uint16_t kPoison = 0xFFFF;

// A device allocation filled with 0xFF bytes (bf16 NaN), freed on scope exit.
struct Poisoned {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit Poisoned(size_t n) : bytes(n) {
    MOK_CUDA_CHECK(cudaMalloc(&ptr, n > 0 ? n : 16));
    MOK_CUDA_CHECK(cudaMemset(ptr, 0xFF, n > 0 ? n : 16));
  }
  ~Poisoned() { cudaFree(ptr); }
  Poisoned(const Poisoned&) = delete;
  Poisoned& operator=(const Poisoned&) = delete;
  std::vector<uint16_t> download() const {
    std::vector<uint16_t> host(bytes / 2);
    MOK_CUDA_CHECK(cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost));
    return host;
  }
};

std::vector<uint16_t> download_bf16(const void* p, size_t count) {
  std::vector<uint16_t> host(count);
  if (count > 0) MOK_CUDA_CHECK(cudaMemcpy(host.data(), p, count * 2, cudaMemcpyDeviceToHost));
  return host;
}

// out = a . b[g]^T with the grouped GEMM (plain epilogue), poisoned first.
std::vector<uint16_t> recompute(const std::vector<uint16_t>& a_host, const void* b, int groups, int64_t n, int64_t k,
                                const std::vector<int32_t>& offset, const std::vector<int32_t>& rows) {
  const int64_t m = static_cast<int64_t>(a_host.size()) / k;
  Poisoned a(a_host.size() * 2), out(static_cast<size_t>(m * n) * 2), d_offset(offset.size() * 4),
      d_rows(rows.size() * 4);
  MOK_CUDA_CHECK(cudaMemcpy(a.ptr, a_host.data(), a_host.size() * 2, cudaMemcpyHostToDevice));
  MOK_CUDA_CHECK(cudaMemcpy(d_offset.ptr, offset.data(), offset.size() * 4, cudaMemcpyHostToDevice));
  MOK_CUDA_CHECK(cudaMemcpy(d_rows.ptr, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
  mok::GroupedGemmArgs args;
  args.a = a.ptr;
  args.b = b;
  args.out = out.ptr;
  args.group_offset = static_cast<const int32_t*>(d_offset.ptr);
  args.group_rows = static_cast<const int32_t*>(d_rows.ptr);
  args.num_groups = groups;
  args.m_total = m;
  args.n = n;
  args.k = k;
  mok::grouped_gemm(args);
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  return out.download();
}

TEST(FusedForwardTraining, KeepsThePreactivationsTheGroupedGemmRecomputesAndChangesNoOutputBit) {
  MOK_REQUIRE_HOPPER();
  for (int world : {1, 2}) {
    SCOPED_TRACE("R = " + std::to_string(world));
    const auto config = mok::make_config(mok::find_shape("small"), world, 150);
    const auto layer = mok::synthetic::make_layer(config, 31, mok::synthetic::RoutingMode::kSkewed);
    mok::DeviceLayer device(layer);
    mok::FusedForwardOptions options;
    options.minibatch_rows = 128;
    options.ring_slots = 2;
    options.timeout_seconds = 5;
    mok::FusedForward forward(config, options);
    const int64_t H = config.hidden, I = config.intermediate, S = config.shared_width();
    const int El = config.experts_per_rank();

    device.poison_outputs();
    forward.run(device.tensors());
    forward.check();
    const auto inference_out = device.download_outputs();

    std::vector<std::unique_ptr<Poisoned>> states, routed, shared;
    std::vector<mok::RankTensors> tensors = device.tensors();
    for (int r = 0; r < world; ++r) {
      const int64_t T = config.tokens_per_rank[static_cast<size_t>(r)];
      states.push_back(std::make_unique<Poisoned>(forward.pass_state_bytes()));
      routed.push_back(std::make_unique<Poisoned>(static_cast<size_t>(forward.saved_rows() * 2 * I) * 2));
      shared.push_back(std::make_unique<Poisoned>(static_cast<size_t>(T * 2 * S) * 2));
      tensors[static_cast<size_t>(r)].pass_state = states.back()->ptr;
      tensors[static_cast<size_t>(r)].preact = routed.back()->ptr;
      tensors[static_cast<size_t>(r)].shared_preact = shared.back()->ptr;
    }
    device.poison_outputs();
    forward.run(tensors);
    forward.check();
    EXPECT_EQ(device.download_outputs(), inference_out) << "the training kernel changed the output";

    const auto schedule = mok::build_schedule(config, layer.routing(), {128, 1});
    std::vector<std::vector<uint16_t>> x(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      x[static_cast<size_t>(r)] = download_bf16(tensors[static_cast<size_t>(r)].x,
                                                static_cast<size_t>(config.tokens_per_rank[static_cast<size_t>(r)] * H));
    }
    for (int r = 0; r < world; ++r) {
      const mok::RankSchedule& rs = schedule.ranks[static_cast<size_t>(r)];
      const int64_t P = rs.padded_rows();
      ASSERT_LE(P, forward.saved_rows());
      // The schedule's rows of x, gathered from their home ranks (zeros for padding).
      std::vector<uint16_t> rows_x(static_cast<size_t>(P * H), 0);
      for (int64_t i = 0; i < P; ++i) {
        const mok::RowSource src = rs.rows[static_cast<size_t>(i)];
        if (src.rank == mok::kPaddingRank) continue;
        std::copy_n(&x[static_cast<size_t>(src.rank)][static_cast<size_t>(src.token * H)], H, &rows_x[i * H]);
      }
      const auto want = recompute(rows_x, tensors[static_cast<size_t>(r)].w13, El, 2 * I, H, rs.expert_offset,
                                  rs.expert_rows);
      const auto got = routed[static_cast<size_t>(r)]->download();
      int64_t real = 0;
      for (int64_t i = 0; i < P; ++i) {
        const bool padding = rs.rows[static_cast<size_t>(i)].rank == mok::kPaddingRank;
        real += padding ? 0 : 1;
        for (int64_t c = 0; c < 2 * I; ++c) {
          const uint16_t g = got[static_cast<size_t>(i * 2 * I + c)];
          if (padding) {
            ASSERT_EQ(g, kPoison) << "rank " << r << ": padding row " << i << " was written";
          } else {
            ASSERT_EQ(g, want[static_cast<size_t>(i * 2 * I + c)]) << "rank " << r << ", schedule row " << i
                                                                    << ", column " << c;
          }
        }
      }
      EXPECT_GT(real, 0) << "rank " << r << " owns no routed row: the check above checked nothing";
      if (S > 0) {
        const int64_t T = config.tokens_per_rank[static_cast<size_t>(r)];
        const std::vector<int32_t> offset = {0, static_cast<int32_t>(T)}, count = {static_cast<int32_t>(T)};
        const auto shared_want = recompute(x[static_cast<size_t>(r)], tensors[static_cast<size_t>(r)].shared_w13, 1,
                                           2 * S, H, offset, count);
        EXPECT_EQ(shared[static_cast<size_t>(r)]->download(), shared_want) << "rank " << r << ": shared expert";
      }
    }
  }
}

TEST(FusedForwardTraining, PreactivationsNeedTheCallersPassState) {
  MOK_REQUIRE_HOPPER();
  const auto config = mok::make_config(mok::find_shape("small"), 1, 64);
  const auto layer = mok::synthetic::make_layer(config, 2);
  mok::DeviceLayer device(layer);
  mok::FusedForward forward(config);
  Poisoned routed(static_cast<size_t>(forward.saved_rows() * 2 * config.intermediate) * 2);
  std::vector<mok::RankTensors> tensors = device.tensors();
  tensors[0].preact = routed.ptr;
  try {
    forward.run(tensors);
    FAIL() << "a pass keeping pre-activations without its pass state ran";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("preact needs pass_state"), std::string::npos) << e.what();
  }
}

}  // namespace
