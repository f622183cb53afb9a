#include "forward_cache.hpp"

#include "lru_cache.hpp"

namespace mok::torch_ops {
namespace {

std::mutex cache_mutex;

LruCache<ForwardKey, CachedForward>& cache() {
  static LruCache<ForwardKey, CachedForward> objects(kForwardCacheCapacity);
  return objects;
}

}  // namespace

std::shared_ptr<CachedForward> cached_forward(const ForwardKey& key, const LayerConfig& config) {
  // Held while an object is made (it allocates): two threads missing on the
  // same key must not make two.
  std::lock_guard<std::mutex> lock(cache_mutex);
  return cache().get_or_make(key, [&] {
    auto made = std::make_shared<CachedForward>();
    made->forward = std::make_unique<FusedForward>(config, forward_options(key.tuning));
    return made;
  });
}

std::vector<int64_t> forward_cache_info() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  return {static_cast<int64_t>(cache().size()), static_cast<int64_t>(cache().capacity())};
}

}  // namespace mok::torch_ops
