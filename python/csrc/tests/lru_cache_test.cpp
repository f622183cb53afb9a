// The op cache's eviction rule (lru_cache.hpp), without torch or a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>

#include "lru_cache.hpp"

namespace {

using Cache = mok::torch_ops::LruCache<int, int>;

std::shared_ptr<int> get(Cache& cache, int key, int* made = nullptr) {
  return cache.get_or_make(key, [&] {
    if (made != nullptr) ++*made;
    return std::make_shared<int>(key * 10);
  });
}

TEST(LruCache, HitsReuseTheObject) {
  Cache cache(2);
  int made = 0;
  auto first = get(cache, 1, &made);
  auto again = get(cache, 1, &made);
  EXPECT_EQ(made, 1);
  EXPECT_EQ(first.get(), again.get());
}

TEST(LruCache, NeverHoldsMoreThanItsCapacity) {
  Cache cache(3);
  for (int key = 0; key < 20; ++key) get(cache, key);
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_TRUE(cache.contains(19) && cache.contains(18) && cache.contains(17));
}

TEST(LruCache, EvictsTheLeastRecentlyUsed) {
  Cache cache(2);
  get(cache, 1);
  get(cache, 2);
  get(cache, 1);  // 2 is now the least recently used
  get(cache, 3);
  EXPECT_TRUE(cache.contains(1));
  EXPECT_FALSE(cache.contains(2));
  EXPECT_TRUE(cache.contains(3));
}

TEST(LruCache, AnEvictedObjectLivesWhileACallerHoldsIt) {
  Cache cache(1);
  auto held = get(cache, 1);
  get(cache, 2);
  EXPECT_FALSE(cache.contains(1));
  EXPECT_EQ(*held, 10);
  EXPECT_EQ(held.use_count(), 1);
}

TEST(LruCache, AFailedMakeAddsNothing) {
  Cache cache(2);
  get(cache, 1);
  EXPECT_THROW(cache.get_or_make(2, []() -> std::shared_ptr<int> { throw std::runtime_error("no memory"); }),
               std::runtime_error);
  EXPECT_TRUE(cache.contains(1));
  EXPECT_FALSE(cache.contains(2));
  EXPECT_EQ(cache.size(), 1u);
}

TEST(LruCache, EvictsBeforeMakingSoTheNewObjectCanUseTheMemory) {
  Cache cache(1);
  auto first = get(cache, 1);
  std::weak_ptr<int> watch = first;
  first.reset();
  bool freed_before_make = false;
  cache.get_or_make(2, [&] {
    freed_before_make = watch.expired();
    return std::make_shared<int>(20);
  });
  EXPECT_TRUE(freed_before_make);
}

}  // namespace
