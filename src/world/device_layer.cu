#include "mok/device_layer.hpp"

#include <cuda_runtime.h>

#include "common/cuda_check.hpp"
#include "mok/bf16.hpp"

namespace mok {

struct DeviceLayer::Buffers {
  std::vector<void*> allocations;
  std::vector<std::pair<void*, size_t>> outputs;  // pointer, bf16 elements

  ~Buffers() {
    for (void* p : allocations) cudaFree(p);
  }

  template <class T>
  T* upload(const T* data, size_t count) {
    if (count == 0) return nullptr;
    void* p = nullptr;
    MOK_CUDA_CHECK(cudaMalloc(&p, count * sizeof(T)));
    allocations.push_back(p);
    MOK_CUDA_CHECK(cudaMemcpy(p, data, count * sizeof(T), cudaMemcpyHostToDevice));
    return static_cast<T*>(p);
  }

  uint16_t* upload_bf16(const float* data, size_t count) {
    std::vector<uint16_t> bits(count);
    for (size_t i = 0; i < count; ++i) bits[i] = float_to_bf16_bits(data[i]);
    return upload(bits.data(), count);
  }

  void* output(size_t count) {
    void* p = nullptr;
    if (count > 0) {
      MOK_CUDA_CHECK(cudaMalloc(&p, count * sizeof(uint16_t)));
      allocations.push_back(p);
    }
    outputs.emplace_back(p, count);
    return p;
  }
};

DeviceLayer::DeviceLayer(const synthetic::Layer& layer, const std::vector<int>& devices)
    : buffers_(std::make_unique<Buffers>()) {
  const LayerConfig& c = layer.config;
  const size_t H = c.hidden, I = c.intermediate, S = c.shared_width(), k = c.top_k;
  const size_t El = c.experts_per_rank();
  int home = 0;
  MOK_CUDA_CHECK(cudaGetDevice(&home));
  const uint16_t* shared_w13 = nullptr;
  const uint16_t* shared_w2 = nullptr;
  for (int r = 0; r < c.world_size; ++r) {
    if (!devices.empty()) MOK_CUDA_CHECK(cudaSetDevice(devices.at(static_cast<size_t>(r))));
    if (S > 0 && (r == 0 || !devices.empty())) {
      shared_w13 = buffers_->upload_bf16(layer.shared_w13.data(), 2 * S * H);
      shared_w2 = buffers_->upload_bf16(layer.shared_w2.data(), H * S);
    }
    const size_t T = c.tokens_per_rank[r];
    RankTensors t;
    t.x = buffers_->upload_bf16(layer.x[r].data(), T * H);
    t.expert_ids = buffers_->upload(layer.expert_ids[r].data(), T * k);
    t.weights = buffers_->upload(layer.weights[r].data(), T * k);
    t.out = buffers_->output(T * H);
    t.w13 = buffers_->upload_bf16(layer.w13.data() + r * El * 2 * I * H, El * 2 * I * H);
    t.w2 = buffers_->upload_bf16(layer.w2.data() + r * El * H * I, El * H * I);
    t.shared_w13 = shared_w13;
    t.shared_w2 = shared_w2;
    tensors_.push_back(t);
  }
  MOK_CUDA_CHECK(cudaSetDevice(home));
}

DeviceLayer::~DeviceLayer() = default;

void DeviceLayer::poison_outputs() {
  for (const auto& [p, count] : buffers_->outputs) {
    if (count > 0) MOK_CUDA_CHECK(cudaMemset(p, 0xFF, count * sizeof(uint16_t)));
  }
}

std::vector<uint16_t> DeviceLayer::download_outputs() const {
  std::vector<uint16_t> all;
  for (const auto& [p, count] : buffers_->outputs) {
    const size_t at = all.size();
    all.resize(at + count);
    if (count > 0) MOK_CUDA_CHECK(cudaMemcpy(all.data() + at, p, count * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  }
  return all;
}

}  // namespace mok
