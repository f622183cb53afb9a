// Host side of the staged backward's row tables: checks, the clear of
// row_of_entry and the launch.
#include "mok/staged_schedule.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.hpp"
#include "device/host/gemm_host.hpp"
#include "device/kernel/staged_schedule_kernel.cuh"
#include "mok/error.hpp"

namespace mok {

void validate_staged_schedule(const StagedScheduleArgs& args) {
  require(args.ranks >= 1 && args.ranks <= kMaxScheduleRanks, "ranks", args.ranks, "must be in [1, 64]");
  require(args.rows_per_rank >= 0, "rows_per_rank", args.rows_per_rank, "must be >= 0");
  require(args.tokens >= 0, "tokens", args.tokens, "must be >= 0");
  require(args.k >= 1, "k", args.k, "must be >= 1");
  for (int r = 0; r < args.ranks; ++r) {
    if (args.rows_per_rank > 0) device::require_pointer(args.rows[r], "rows[r]", 4);
    device::require_pointer(args.schedule_end[r], "schedule_end[r]", 4);
  }
  if (args.rows_per_rank > 0) {
    device::require_pointer(args.token_of_row, "token_of_row", 8);
    device::require_pointer(args.entry_of_row, "entry_of_row", 8);
  }
  if (args.tokens > 0) device::require_pointer(args.row_of_entry, "row_of_entry", 8);
}

void staged_schedule(const StagedScheduleArgs& args, CUstream_st* stream) {
  validate_staged_schedule(args);
  const int64_t entries = args.tokens * args.k;
  if (entries > 0) {
    MOK_CUDA_CHECK(cudaMemsetAsync(args.row_of_entry, 0, static_cast<size_t>(entries) * sizeof(int64_t), stream));
  }
  const int64_t num_rows = args.ranks * args.rows_per_rank;
  if (num_rows == 0) return;
  constexpr int64_t kThreads = device::kStagedScheduleThreads;
  const int64_t blocks = std::min<int64_t>((num_rows + kThreads - 1) / kThreads, 4096);
  device::staged_schedule_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
  MOK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mok
