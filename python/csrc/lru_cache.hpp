// A small least-recently-used map from keys to shared objects. Eviction only
// drops the cache's reference: a caller still holding an object keeps it
// alive until it lets go. Not thread-safe by itself; the owner locks.
#pragma once

#include <cstddef>
#include <functional>
#include <iterator>
#include <list>
#include <map>
#include <memory>
#include <utility>

namespace mok::torch_ops {

template <class Key, class Value>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // The object under `key`, made by `make()` on a miss; either way it becomes
  // the most recently used. A miss on a full cache first evicts the least
  // recently used object, before `make` runs: the objects hold device memory,
  // and the new one may need what the old one frees. If `make` throws, the
  // cache holds nothing under `key`.
  std::shared_ptr<Value> get_or_make(const Key& key, const std::function<std::shared_ptr<Value>()>& make) {
    auto found = index_.find(key);
    if (found != index_.end()) {
      order_.splice(order_.begin(), order_, found->second);
      return found->second->second;
    }
    if (index_.size() >= capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    std::shared_ptr<Value> value = make();
    order_.emplace_front(key, value);
    index_.emplace(key, order_.begin());
    return value;
  }

  size_t size() const { return index_.size(); }
  size_t capacity() const { return capacity_; }
  bool contains(const Key& key) const { return index_.count(key) != 0; }

 private:
  using Entry = std::pair<Key, std::shared_ptr<Value>>;
  size_t capacity_;
  std::list<Entry> order_;  // most recently used first
  std::map<Key, typename std::list<Entry>::iterator> index_;
};

}  // namespace mok::torch_ops
