// mbarrier and TMA (bulk tensor copy) as mok's device code uses them: one-line
// wrappers over CCCL's cuda::ptx, named after what they do, so that role code
// never spells PTX. Everything here is CTA-scoped (no clusters).
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace mok::device {

// --- mbarrier ---------------------------------------------------------------

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  cuda::ptx::mbarrier_init(bar, arrivals);
}

// Ends an mbarrier's life, so that its shared memory may hold something else
// (PTX requires it before the bytes are reused). No cuda::ptx wrapper for it.
__device__ __forceinline__ void mbarrier_inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
               : "memory");
}

// Makes barrier initialisation visible to the async proxy (TMA completes
// transactions on the barriers); follow it with a CTA barrier.
__device__ __forceinline__ void fence_barrier_init() {
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}

// Arrive once (release, CTA scope).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  (void)cuda::ptx::mbarrier_arrive(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                   cuda::ptx::space_shared, bar);
}

// Arrive once and announce `bytes` of TMA transactions that will complete the
// current phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                             cuda::ptx::space_shared, bar, bytes);
}

// What a barrier wait does when it has waited `timeout_ns`: a wait that long
// means a protocol bug, not a slow GPU, so the kernel must end instead of
// hanging the machine; a policy's operator() never returns. By default it
// traps (the launch fails with cudaErrorLaunchFailure). No printf here: a
// function call anywhere in the kernel makes ptxas serialise every wgmma
// (warning C7510). Code that raised its register budget with setmaxnreg
// cannot trap (roles/consumer_stall.cuh says why) and passes its own policy.
// kBackstopWaitNs: how long such a wait lasts before it ends the kernel
// (the GEMM consumers wait the pass's timeout more, consumer_stall.cuh).
inline constexpr uint64_t kBackstopWaitNs = 10ull * 1000 * 1000 * 1000;

struct TrapOnStall {
  uint64_t timeout_ns = kBackstopWaitNs;
  __device__ void operator()() const { __trap(); }
};

// Blocks until the phase with parity `parity` has completed (acquire, CTA).
template <class OnStall = TrapOnStall>
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity,
                                                     const OnStall& on_stall = {}) {
  if (cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cta, bar,
                                          parity)) {
    return;
  }
  const uint64_t start = cuda::ptx::get_sreg_globaltimer();
  uint32_t polls = 0;
  while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cta, bar,
                                              parity)) {
    if ((++polls & 1023u) == 0 && cuda::ptx::get_sreg_globaltimer() - start > on_stall.timeout_ns) {
      on_stall();
    }
  }
}

// --- TMA loads (global -> shared, completing on an mbarrier) -----------------
// Coordinates are in elements, innermost dimension first, as in the tensor
// map. Out-of-bounds elements are zero-filled and still count towards the
// barrier's transaction bytes.

__device__ __forceinline__ void tma_load_2d(void* dst, const void* tensor_map, uint64_t* bar,
                                            int32_t c0, int32_t c1) {
  const int32_t coords[2] = {c0, c1};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst,
                                  tensor_map, coords, bar);
}

__device__ __forceinline__ void tma_load_3d(void* dst, const void* tensor_map, uint64_t* bar,
                                            int32_t c0, int32_t c1, int32_t c2) {
  const int32_t coords[3] = {c0, c1, c2};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst,
                                  tensor_map, coords, bar);
}

__device__ __forceinline__ void tma_load_4d(void* dst, const void* tensor_map, uint64_t* bar,
                                            int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst,
                                  tensor_map, coords, bar);
}

// Orders this thread's generic-proxy writes to shared memory before later
// async-proxy reads of it (wgmma operands): after a thread patches a stage
// that TMA filled, and before the barrier that lets wgmma read it.
__device__ __forceinline__ void fence_proxy_async_shared() {
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
}

// Pulls a __grid_constant__ tensor map into the descriptor cache ahead of use.
__device__ __forceinline__ void tma_prefetch_descriptor(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map) : "memory");
}

}  // namespace mok::device
