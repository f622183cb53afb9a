// Zeroes the rows no group owns (include/mok/zero_padding.hpp). Block b
// owns rows [b * kZeroPaddingRows, (b + 1) * kZeroPaddingRows) of the buffer
// and clears their intersection with every gap: after each group's rows
// [offset[g] + rows[g], offset[g + 1]), the tail [offset[G], m_total) and
// the head [0, offset[0]). Splitting by rows, not by gap, keeps every SM
// busy when one gap is large (a schedule's unused tail is often the largest:
// one block per gap left that tail to a single SM, ~2x slower than clearing
// the whole buffer, docs/perf-notes.md b4).
#pragma once

#include <cstdint>

namespace mok::device {

inline constexpr int kZeroPaddingRows = 64;

__global__ void zero_padding_kernel(uint8_t* data, int64_t row_bytes, int64_t m_total, const int32_t* group_offset,
                                    const int32_t* group_rows, int num_groups) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kZeroPaddingRows;
  const int64_t end = min(first + kZeroPaddingRows, m_total);
  auto clear = [&](int64_t gap_first, int64_t gap_end) {
    gap_first = max(gap_first, first);
    gap_end = min(gap_end, end);
    if (gap_end <= gap_first) return;
    uint4* begin = reinterpret_cast<uint4*>(data + gap_first * row_bytes);
    const int64_t chunks = (gap_end - gap_first) * row_bytes / 16;
    for (int64_t i = threadIdx.x; i < chunks; i += blockDim.x) begin[i] = make_uint4(0u, 0u, 0u, 0u);
  };
  clear(0, group_offset[0]);
  for (int g = 0; g < num_groups; ++g) {
    clear(static_cast<int64_t>(group_offset[g]) + group_rows[g], group_offset[g + 1]);
  }
  clear(group_offset[num_groups], m_total);
}

}  // namespace mok::device
