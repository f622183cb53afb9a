// Thread-block clusters of two CTAs that share TMA loads (multicast): the
// few cluster operations the grouped GEMM's 2-CTA variant needs, as wrappers
// over CCCL's cuda::ptx named after what they do.
//
// Protocol (gemm/fp8_mainloop.cuh, kernel/grouped_gemm_kernel.cuh): both CTAs
// of a cluster walk the same tiles; each multicasts half of the shared A box
// into both CTAs' stage, so a stage is free only when the consumers of BOTH
// CTAs released it -- every consumer warp arrives on its own CTA's empty
// barrier and on the peer's. cluster_sync() after the barriers are
// initialised (no multicast or remote arrival may reach an uninitialised
// barrier) and before exit (none may reach a CTA that is gone).
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace mok::device {

// This CTA's rank in its cluster (0 or 1 for clusters of two).
__device__ __forceinline__ uint32_t cluster_rank() { return cuda::ptx::get_sreg_cluster_ctarank(); }

// Every thread of every CTA of the cluster: arrive (release), then wait
// (acquire) for all the others.
__device__ __forceinline__ void cluster_sync() {
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire);
}

// One arrival on the barrier at `bar`'s offset in the shared memory of the
// cluster's CTA `peer` (release at cluster scope: this thread's reads of the
// stage happen before the peer's producer overwrites it). The peer's address
// is made with mapa on the 32-bit shared window and used as a
// shared::cluster address directly: the generic-pointer route (CCCL's
// overload converts a mapped generic pointer with cvta.to.shared) leaves the
// conversion of another CTA's address to the PTX ISA's undefined cases.
__device__ __forceinline__ void mbarrier_arrive_peer(uint64_t* bar, uint32_t peer) {
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(peer));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

// TMA load of a 2-D box into the same shared-memory offset of every CTA in
// `cta_mask`, completing on the barrier at `bar`'s offset in each of them.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const void* tensor_map, uint64_t* bar, int32_t c0,
                                                      int32_t c1, uint16_t cta_mask) {
  const int32_t coords[2] = {c0, c1};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, tensor_map, coords, bar,
                                  cta_mask);
}

}  // namespace mok::device
