// The device Sync backend of src/protocol/counters.hpp. kScope is the scope of
// every counter operation: cuda::thread_scope_device when all ranks share one
// GPU (the virtual world), cuda::thread_scope_system for peers over NVLink.
// Waits give up after a deadline read from %globaltimer so that a protocol
// bug becomes a stall report, never a hung GPU.
#pragma once

#include <cuda/atomic>
#include <cuda/ptx>

#include <cstdint>

namespace mok::protocol {

template <cuda::thread_scope kScope>
struct DeviceSync {
  uint64_t timeout_ns;

  using Ref = cuda::atomic_ref<uint32_t, kScope>;

  __device__ __forceinline__ static uint32_t load_acquire(const uint32_t* p) {
    return Ref(*const_cast<uint32_t*>(p)).load(cuda::memory_order_acquire);
  }
  __device__ __forceinline__ static uint32_t load_relaxed(const uint32_t* p) {
    return Ref(*const_cast<uint32_t*>(p)).load(cuda::memory_order_relaxed);
  }
  __device__ __forceinline__ static void store_release(uint32_t* p, uint32_t v) {
    Ref(*p).store(v, cuda::memory_order_release);
  }
  __device__ __forceinline__ static void add_release(uint32_t* p, uint32_t v) {
    Ref(*p).fetch_add(v, cuda::memory_order_release);
  }
  __device__ __forceinline__ static uint32_t fetch_add_relaxed(uint32_t* p, uint32_t v) {
    return Ref(*p).fetch_add(v, cuda::memory_order_relaxed);
  }
  __device__ __forceinline__ static uint32_t fetch_add_acq_rel(uint32_t* p, uint32_t v) {
    return Ref(*p).fetch_add(v, cuda::memory_order_acq_rel);
  }
  __device__ __forceinline__ static void store_relaxed(uint32_t* p, uint32_t v) {
    Ref(*p).store(v, cuda::memory_order_relaxed);
  }
  __device__ __forceinline__ static bool compare_exchange(uint32_t* p, uint32_t expected, uint32_t desired) {
    return Ref(*p).compare_exchange_strong(expected, desired, cuda::memory_order_acq_rel);
  }
  __device__ __forceinline__ static uint64_t now() { return cuda::ptx::get_sreg_globaltimer(); }
  __device__ __forceinline__ uint64_t start_clock() const { return now(); }
  __device__ __forceinline__ bool expired(uint64_t start) const { return now() - start > timeout_ns; }
  __device__ __forceinline__ static void pause() { __nanosleep(32); }
};

}  // namespace mok::protocol
