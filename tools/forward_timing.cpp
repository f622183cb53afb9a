// Timing the fused forward and the paired rounds (forward_timing.hpp).
#include "forward_timing.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>

#include "common/cuda_check.hpp"

namespace mok::tools {
namespace {

// Two CUDA events, destroyed however the timing ends.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    MOK_CUDA_CHECK(cudaEventCreate(&start));
    MOK_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;

  float elapsed_ms() const {
    MOK_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    MOK_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms;
  }
};

}  // namespace

ForwardTiming time_forward(FusedForward& forward, const std::vector<RankTensors>& tensors, int iterations) {
  EventPair events;
  for (int i = 0; i < 3; ++i) forward.run(tensors);
  forward.check();
  std::vector<double> ms, enqueue_us;
  for (int i = 0; i < iterations; ++i) {
    MOK_CUDA_CHECK(cudaEventRecord(events.start));
    const auto host_start = std::chrono::steady_clock::now();
    forward.run(tensors);
    enqueue_us.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - host_start).count() * 1e6);
    MOK_CUDA_CHECK(cudaEventRecord(events.stop));
    ms.push_back(events.elapsed_ms());
  }
  const double back_to_back = time_back_to_back(forward, tensors, iterations, 0);
  std::sort(ms.begin(), ms.end());
  std::sort(enqueue_us.begin(), enqueue_us.end());
  return {ms[ms.size() / 2], back_to_back, enqueue_us[enqueue_us.size() / 2], ms.front(), ms.back()};
}

double time_back_to_back(FusedForward& forward, const std::vector<RankTensors>& tensors, int iterations,
                         int warmup) {
  EventPair events;
  for (int i = 0; i < warmup; ++i) forward.run(tensors);
  MOK_CUDA_CHECK(cudaEventRecord(events.start));
  for (int i = 0; i < iterations; ++i) forward.run(tensors);
  MOK_CUDA_CHECK(cudaEventRecord(events.stop));
  const double total = events.elapsed_ms();
  forward.check();
  return total / static_cast<double>(iterations);
}

std::vector<Visit> paired_rounds(std::span<FusedForward* const> forwards, int rounds, bool mirrored,
                                 const std::function<ForwardTiming(FusedForward&)>& timer,
                                 const std::function<void(const Visit&)>& on_visit) {
  std::vector<Visit> visits;
  auto visit = [&](int round, size_t index) {
    visits.push_back({round, index, timer(*forwards[index])});
    if (on_visit) on_visit(visits.back());
  };
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < forwards.size(); ++i) visit(round, i);
    if (mirrored) {
      for (size_t i = forwards.size(); i-- > 0;) visit(round, i);
    }
  }
  return visits;
}

std::vector<double> round_ratios(const std::vector<Visit>& visits, size_t numerator, size_t denominator,
                                 double ForwardTiming::*field) {
  std::vector<double> top, bottom;
  for (const Visit& v : visits) {
    const size_t round = static_cast<size_t>(v.round);
    if (top.size() <= round) {
      top.resize(round + 1, 0.0);
      bottom.resize(round + 1, 0.0);
    }
    if (v.index == numerator) top[round] += v.timing.*field;
    if (v.index == denominator) bottom[round] += v.timing.*field;
  }
  std::vector<double> ratios;
  for (size_t r = 0; r < top.size(); ++r) ratios.push_back(top[r] / bottom[r]);
  return ratios;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

}  // namespace mok::tools
