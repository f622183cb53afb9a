// The FusedForward objects behind torch.ops.mok.fused_forward, one per layer
// shape, device and tuning, made on first use and kept for the next call.
//
// The cache holds at most kForwardCacheCapacity objects and evicts the least
// recently used: each object owns a workspace (for DeepSeek-V3's per-GPU share,
// a ring of about 120 MB per rank), and a token count that changes from call
// to call would otherwise add one every call. Callers hold a CachedForward
// through a shared_ptr, so an evicted object outlives a pass still being
// enqueued; its destructor frees device memory with cudaFree, which waits for
// the passes already running on the device.
#pragma once

#include <compare>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "mok/fused_forward.hpp"
#include "mok/layer_config.hpp"
#include "tuning_options.hpp"

namespace mok::torch_ops {

inline constexpr size_t kForwardCacheCapacity = 8;

// Everything a FusedForward is made from; the tuning values come from the
// one option list (tuning_options.hpp).
struct ForwardKey {
  std::vector<int> tokens_per_rank;
  int hidden = 0, intermediate = 0, num_experts = 0, top_k = 0, shared_width = 0;
  int dtype = 0;  // mok::DType of the routed experts: bf16 and FP8 objects of one shape differ
  int device = 0;
  TuningValues tuning{};
  auto operator<=>(const ForwardKey&) const = default;
};

// One object and the lock that makes its passes one at a time: run() reuses
// the workspace and its host-side state (the tensor maps of the last pass),
// so two threads must not enqueue on it at once.
struct CachedForward {
  std::mutex mutex;
  std::unique_ptr<FusedForward> forward;
};

// The object for `key` (made from `config` and `tuning` on a miss, on the
// current device); the caller locks its mutex around run() and check().
std::shared_ptr<CachedForward> cached_forward(const ForwardKey& key, const LayerConfig& config);

// {objects held, capacity}: for tests and for users who watch memory.
std::vector<int64_t> forward_cache_info();

}  // namespace mok::torch_ops
