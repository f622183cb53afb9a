// The staged backward's row tables from the saved schedule
// (include/mok/staged_schedule.hpp): one thread per saved row.
#pragma once

#include <cstdint>

#include "mok/staged_schedule.hpp"

namespace mok::device {

inline constexpr int kStagedScheduleThreads = 256;

__global__ void __launch_bounds__(kStagedScheduleThreads)
    staged_schedule_kernel(const __grid_constant__ StagedScheduleArgs a) {
  const int64_t num_rows = a.ranks * a.rows_per_rank;
  const int64_t entries = a.tokens * a.k;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < num_rows;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int rank = static_cast<int>(i / a.rows_per_rank);
    const int64_t j = i - rank * a.rows_per_rank;
    const int32_t* row = a.rows[rank] + 3 * j;
    const int home = row[0];
    const bool real = j < *a.schedule_end[rank] && home >= 0;
    // A home outside the world adds no offset (as the Python reference's
    // per-rank sum over home == r leaves it).
    const int64_t token = real ? row[1] + (home < a.ranks ? a.first_token[home] : 0) : 0;
    const int64_t entry = real ? token * a.k + row[2] : entries;
    a.token_of_row[i] = token;
    a.entry_of_row[i] = entry;
    if (real && entry >= 0 && entry < entries) a.row_of_entry[entry] = i;
  }
}

}  // namespace mok::device
