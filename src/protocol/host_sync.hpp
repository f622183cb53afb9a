// The host Sync backend of src/protocol/counters.hpp: std::atomic_ref with the
// same orders the device uses, and a wall-clock timeout. It drives the CPU
// model of the protocol (host threads standing in for SM roles).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace mok::protocol {

class HostSync {
 public:
  using Clock = std::chrono::steady_clock;

  explicit HostSync(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  static uint32_t load_acquire(const uint32_t* p) {
    return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(p)).load(std::memory_order_acquire);
  }
  static uint32_t load_relaxed(const uint32_t* p) {
    return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(p)).load(std::memory_order_relaxed);
  }
  static void store_release(uint32_t* p, uint32_t v) {
    std::atomic_ref<uint32_t>(*p).store(v, std::memory_order_release);
  }
  static void add_release(uint32_t* p, uint32_t v) {
    std::atomic_ref<uint32_t>(*p).fetch_add(v, std::memory_order_release);
  }
  static uint32_t fetch_add_relaxed(uint32_t* p, uint32_t v) {
    return std::atomic_ref<uint32_t>(*p).fetch_add(v, std::memory_order_relaxed);
  }
  static uint32_t fetch_add_acq_rel(uint32_t* p, uint32_t v) {
    return std::atomic_ref<uint32_t>(*p).fetch_add(v, std::memory_order_acq_rel);
  }
  static void store_relaxed(uint32_t* p, uint32_t v) {
    std::atomic_ref<uint32_t>(*p).store(v, std::memory_order_relaxed);
  }
  static bool compare_exchange(uint32_t* p, uint32_t expected, uint32_t desired) {
    return std::atomic_ref<uint32_t>(*p).compare_exchange_strong(expected, desired,
                                                                 std::memory_order_acq_rel);
  }
  Clock::time_point start_clock() const { return Clock::now(); }
  bool expired(Clock::time_point start) const { return Clock::now() - start > timeout_; }
  static void pause() { std::this_thread::yield(); }

 private:
  std::chrono::milliseconds timeout_;
};

}  // namespace mok::protocol
