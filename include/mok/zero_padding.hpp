// Zeroes the rows of a grouped buffer that no group owns -- the padding
// between groups and the rows before the first and after the last -- and
// touches no other row. The grouped GEMMs never write those rows; a caller
// that promises zeros there (the torch ops' data gradients, whose padding
// rows a caller may sum) runs this instead of clearing the whole buffer
// first: the work is the padding's, not the buffer's. Host API only.
//
//   data          [m_total, row_bytes]   any element type; row_bytes a multiple of 16
//   group_offset  int32 [G + 1], group_rows int32 [G]: DEVICE memory, the
//                 grouped GEMMs' layout (group g owns rows [offset[g],
//                 offset[g] + rows[g])); trusted as they are there
//
// Asynchronous on `stream`, no host synchronisation; throws mok::Error on bad
// arguments before any launch.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace mok {

struct ZeroPaddingArgs {
  void* data = nullptr;
  int64_t row_bytes = 0;
  int64_t m_total = 0;
  const int32_t* group_offset = nullptr;
  const int32_t* group_rows = nullptr;
  int num_groups = 0;
};

void validate_zero_padding(const ZeroPaddingArgs& args);
void zero_padding_rows(const ZeroPaddingArgs& args, CUstream_st* stream = nullptr);

}  // namespace mok
