// Test helpers shared by the GEMM suites: an owning device buffer, random
// bf16 data and group layouts with padding between groups.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "common/cuda_check.hpp"
#include "mok/bf16.hpp"

namespace mok::gemm_test {

// Owning device buffer.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    MOK_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(count, 1) * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void upload(const std::vector<T>& host) {
    MOK_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    MOK_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

inline std::vector<uint16_t> random_bf16(size_t count, std::mt19937& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<uint16_t> v(count);
  for (auto& x : v) x = mok::float_to_bf16_bits(dist(rng));
  return v;
}

// Groups with real rows and padding after each; a tail of unowned rows after
// the last group.
struct Layout {
  std::vector<int32_t> rows;    // [G]
  std::vector<int32_t> offset;  // [G + 1]
  int64_t m_total = 0;

  static Layout make(const std::vector<int32_t>& rows, const std::vector<int32_t>& padding,
                     int32_t first = 0, int32_t tail = 0) {
    Layout l;
    l.rows = rows;
    int32_t at = first;
    for (size_t g = 0; g < rows.size(); ++g) {
      l.offset.push_back(at);
      at += rows[g] + padding[g];
    }
    l.offset.push_back(at);
    l.m_total = at + tail;
    return l;
  }
  int groups() const { return static_cast<int>(rows.size()); }
  // -1 for rows no group owns (padding and tail).
  std::vector<int> owner() const {
    std::vector<int> who(static_cast<size_t>(m_total), -1);
    for (int g = 0; g < groups(); ++g) {
      for (int32_t r = 0; r < rows[g]; ++r) who[static_cast<size_t>(offset[g] + r)] = g;
    }
    return who;
  }
};

}  // namespace mok::gemm_test
