// A grouped kernel's group table (each group's first row and row count) in
// shared memory. Every role reads its next tile's entry between two tiles:
// from global memory that is an L2 round trip under the GEMM's load, on the
// path from one tile's last k-block to the next tile's first, in the
// producer (the next TMA waits for the row) and in the consumers (the K
// loop's length). Copied once at the start, it is a shared-memory load
// (docs/perf-notes.md v6: the weight gradient's stage waits 8.5 -> 5.3% of
// its stall samples).
#pragma once

#include <cstdint>

namespace mok::device {

// Groups a kernel copies (more: the walk reads global memory, as before).
inline constexpr int kSmemGroups = 512;

struct SmemGroupTable {
  int32_t rows[kSmemGroups];
  int32_t offset[kSmemGroups];
};

// Every thread of the CTA (kThreads of them) calls it; the copy is visible after the
// __syncthreads that must follow (the kernel's setup barrier). Returns
// whether the table was copied (else the walkers read global memory).
template <int kThreads>
__device__ __forceinline__ bool stage_group_table(SmemGroupTable& table, const int32_t* offset, const int32_t* rows,
                                                  int num_groups) {
  if (num_groups > kSmemGroups) return false;
  for (int g = static_cast<int>(threadIdx.x); g < num_groups; g += kThreads) {
    table.rows[g] = rows[g];
    table.offset[g] = offset[g];
  }
  return true;
}

}  // namespace mok::device
