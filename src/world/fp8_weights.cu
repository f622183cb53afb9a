#include "world/fp8_weights.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <span>
#include <thread>

#include "common/cuda_check.hpp"
#include "mok/error.hpp"
#include "mok/fp8.hpp"

namespace mok::world {
namespace {

// One rank's quantized weights on the host, [El, ...] each.
struct HostRank {
  std::vector<uint8_t> w13, w2, w13_scales, w2_scales;
};

// Quantizes one expert's matrix [rows, cols] into the rank's arrays at
// group `e`. A weight's 128 x 128 blocks never span two experts, so
// quantizing each expert as a group of its own gives exactly the bytes of
// quantize_weight over all of them (what the CPU reference does).
void quantize_expert(const float* weight, int64_t e, int64_t rows, int64_t cols, std::vector<uint8_t>& values,
                     std::vector<uint8_t>& scales) {
  const fp8::QuantizedWeight q =
      fp8::quantize_weight(std::span<const float>(weight, static_cast<size_t>(rows * cols)), 1, rows, cols);
  std::copy(q.values.begin(), q.values.end(), values.begin() + e * rows * cols);
  std::copy(q.scales.begin(), q.scales.end(), scales.begin() + static_cast<int64_t>(q.scales.size()) * e);
}

}  // namespace

Fp8RoutedWeights::Fp8RoutedWeights(const synthetic::Layer& layer, const std::vector<int>& devices, int threads) {
  const LayerConfig& c = layer.config;
  const int64_t H = c.hidden, I = c.intermediate, El = c.experts_per_rank(), R = c.world_size;
  if (H % fp8::kBlock != 0 || I % fp8::kBlock != 0) {
    throw Error("Fp8RoutedWeights: hidden and intermediate must be multiples of 128 (128 x 128 scale blocks)");
  }
  const int64_t blocks13 = (2 * I / fp8::kBlock) * (H / fp8::kBlock), blocks2 = (H / fp8::kBlock) * (I / fp8::kBlock);
  std::vector<HostRank> host(static_cast<size_t>(R));
  for (HostRank& h : host) {
    h.w13.resize(static_cast<size_t>(El * 2 * I * H));
    h.w2.resize(static_cast<size_t>(El * H * I));
    h.w13_scales.resize(static_cast<size_t>(El * blocks13));
    h.w2_scales.resize(static_cast<size_t>(El * blocks2));
  }
  // Jobs: (rank, local expert, matrix), taken from one counter. Each writes
  // only its own expert's slice, so any split over threads gives the same bytes.
  const int64_t jobs = R * El * 2;
  std::atomic<int64_t> next{0};
  std::exception_ptr failure;
  std::atomic<bool> failed{false};
  auto work = [&] {
    try {
      for (int64_t j = next++; j < jobs && !failed; j = next++) {
        const int64_t r = j / (2 * El), e = (j / 2) % El, global = r * El + e;
        HostRank& h = host[static_cast<size_t>(r)];
        if (j % 2 == 0) {
          quantize_expert(layer.w13.data() + global * 2 * I * H, e, 2 * I, H, h.w13, h.w13_scales);
        } else {
          quantize_expert(layer.w2.data() + global * H * I, e, H, I, h.w2, h.w2_scales);
        }
      }
    } catch (...) {
      if (!failed.exchange(true)) failure = std::current_exception();
    }
  };
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int64_t count = std::min<int64_t>(jobs, threads > 0 ? threads : static_cast<int64_t>(cores));
  std::vector<std::thread> pool;
  for (int64_t i = 1; i < count; ++i) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);

  int home = 0;
  MOK_CUDA_CHECK(cudaGetDevice(&home));
  auto upload = [&](const std::vector<uint8_t>& bytes) {
    void* p = nullptr;
    MOK_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes.size(), 1)));
    allocations_.push_back(p);
    MOK_CUDA_CHECK(cudaMemcpy(p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
    return p;
  };
  try {
    for (int64_t r = 0; r < R; ++r) {
      if (!devices.empty()) MOK_CUDA_CHECK(cudaSetDevice(devices.at(static_cast<size_t>(r))));
      const HostRank& h = host[static_cast<size_t>(r)];
      ranks_.push_back(Rank{upload(h.w13), upload(h.w2), upload(h.w13_scales), upload(h.w2_scales)});
    }
  } catch (...) {
    cudaSetDevice(home);
    for (void* p : allocations_) cudaFree(p);
    throw;
  }
  MOK_CUDA_CHECK(cudaSetDevice(home));
}

Fp8RoutedWeights::~Fp8RoutedWeights() {
  for (void* p : allocations_) cudaFree(p);
}

std::vector<RankTensors> Fp8RoutedWeights::apply(std::vector<RankTensors> tensors) const {
  if (tensors.size() != ranks_.size()) {
    throw Error("Fp8RoutedWeights::apply: got tensors for " + std::to_string(tensors.size()) + " ranks; the layer has " +
                std::to_string(ranks_.size()));
  }
  for (size_t r = 0; r < tensors.size(); ++r) {
    tensors[r].w13 = ranks_[r].w13;
    tensors[r].w2 = ranks_[r].w2;
    tensors[r].w13_scales = ranks_[r].w13_scales;
    tensors[r].w2_scales = ranks_[r].w2_scales;
  }
  return tensors;
}

}  // namespace mok::world
