// Zeroes the rows no group owns (include/mok/zero_padding.hpp). Block g <
// num_groups clears the gap after group g's rows, [offset[g] + rows[g],
// offset[g + 1]); block num_groups clears [offset[G], m_total) and
// [0, offset[0]). Each gap is one contiguous byte range, written 16 bytes
// per thread and step.
#pragma once

#include <cstdint>

namespace mok::device {

__global__ void zero_padding_kernel(uint8_t* data, int64_t row_bytes, int64_t m_total, const int32_t* group_offset,
                                    const int32_t* group_rows, int num_groups) {
  const int g = static_cast<int>(blockIdx.x);
  auto clear = [&](int64_t first_row, int64_t end_row) {
    if (end_row <= first_row) return;
    uint4* begin = reinterpret_cast<uint4*>(data + first_row * row_bytes);
    const int64_t chunks = (end_row - first_row) * row_bytes / 16;
    for (int64_t i = threadIdx.x; i < chunks; i += blockDim.x) begin[i] = make_uint4(0u, 0u, 0u, 0u);
  };
  if (g < num_groups) {
    clear(static_cast<int64_t>(group_offset[g]) + group_rows[g], group_offset[g + 1]);
  } else {
    clear(group_offset[num_groups], m_total);
    clear(0, group_offset[0]);
  }
}

}  // namespace mok::device
