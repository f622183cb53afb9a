// Bulk copies (cp.async.bulk) for moving whole token rows -- global -> shared
// completing on an mbarrier, and shared -> global tracked by bulk groups --
// and the tensor (TMA) store of a tile's box, tracked the same way. One-line wrappers over cuda::ptx, named by what they do.
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace mok::device {

// `bytes` (a multiple of 16, 16-byte aligned ends) from global into shared
// memory; completes `bytes` transaction bytes on `bar`.
__device__ __forceinline__ void bulk_load(void* smem_dst, const void* gmem_src, uint32_t bytes,
                                          uint64_t* bar) {
  cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, smem_dst, gmem_src,
                           bytes, bar);
}

// `bytes` from shared into global memory, as part of the current bulk group.
__device__ __forceinline__ void bulk_store(void* gmem_dst, const void* smem_src, uint32_t bytes) {
  cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, gmem_dst, smem_src, bytes);
}

// A box of a tensor (its map's box, at element coordinates {c0, c1}) from
// shared into global memory, as part of the current bulk group; the map's
// swizzle says how the box lies in shared memory. Elements past the tensor's
// edges are not written.
__device__ __forceinline__ void tma_store_2d(const void* tensor_map, const void* smem_src, int32_t c0, int32_t c1) {
  const int32_t coords[2] = {c0, c1};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, tensor_map, coords, smem_src);
}

// The same box added into global memory instead of stored over it
// (cp.reduce.async.bulk.tensor .add; the element type is the map's): each
// element becomes old + box, rounded to that type, an atomic addition at L2.
// As tma_store_2d: part of the current bulk group, edges not written.
__device__ __forceinline__ void tma_reduce_add_2d(const void* tensor_map, const void* smem_src, int32_t c0,
                                                  int32_t c1) {
  const int32_t coords[2] = {c0, c1};
  cuda::ptx::cp_reduce_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add,
                                         tensor_map, coords, smem_src);
}

// Asks L2 to fetch `bytes` (a multiple of 16, 16-byte aligned start) of
// global memory, without waiting and without a barrier: a hint, so reads
// issued later hit L2 instead of waiting on DRAM. CCCL 13.0's cuda::ptx has
// no wrapper for cp.async.bulk.prefetch.
__device__ __forceinline__ void bulk_prefetch_l2(const void* gmem_src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(gmem_src), "r"(bytes) : "memory");
}

// Asks L2 to fetch a box of a tensor (its map's box at element coordinates
// {c0, c1}), as bulk_prefetch_l2 does for a range: a hint, nothing waits for
// it; elements past the tensor's edges are not fetched. (Inline PTX: CCCL
// 13.0's cuda::ptx has no cp.async.bulk.prefetch.tensor either.)
__device__ __forceinline__ void tma_prefetch_l2_2d(const void* tensor_map, int32_t c0, int32_t c1) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n" ::"l"(tensor_map), "r"(c0),
               "r"(c1)
               : "memory");
}

__device__ __forceinline__ void bulk_commit() { cuda::ptx::cp_async_bulk_commit_group(); }

// Until at most N committed groups still read their shared source.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<N>{});
}

// Until every committed group has completed its writes.
__device__ __forceinline__ void bulk_wait_all() {
  cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
}

// Orders this thread's generic-proxy accesses with async-proxy (TMA, bulk)
// accesses to global memory: after acquiring a flag and before a TMA load of
// the data it guards; after bulk writes complete and before releasing a flag.
__device__ __forceinline__ void fence_proxy_async_global() {
  cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
}

}  // namespace mok::device
