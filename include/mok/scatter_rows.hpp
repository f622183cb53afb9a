// Row scatter: each token's rows copied to the grouped rows its k entries
// were scheduled to -- the staged backward's x and dout rows in schedule
// order. Token-major: every source row is read once and written k times, so
// a layer moves T H + T k H elements a source instead of the 2 T k H of a
// row gather (`index_select` by the rows' tokens), which reads a source row
// again for each of its k rows, mostly from DRAM once the source is larger
// than L2. Host API only.
//
//   sources[s]    bf16 [tokens, width]     1..kMaxScatterSources tensors, one row per token
//   outs[s]       bf16 [num_rows, width]   outs[s][r] = sources[s][e / k] if row r is claimed
//                                          by entry e = token * k + slot, else zeros
//   row_of_entry  int64 [tokens * k]       the row each entry was scheduled to
//   entry_of_row  int64 [num_rows]         the entry each row holds
//
// Row r is claimed by entry e when both indices agree: row_of_entry[e] == r
// and entry_of_row[r] == e. So each row has at most one writer (the result
// is the same every run), and an index that is out of range or inconsistent
// (a padding row, an entry a bad expert id kept out of the schedule) claims
// nothing: its row is zeroed, never written twice or out of bounds.
// With zero_unclaimed_rows false, unclaimed rows are left as they were (a
// caller whose readers never read them -- the staged backward's grouped
// kernels read a group's real rows only -- saves their writes: the groups'
// padding and the unused tail of the saved schedule's capacity).
// width a multiple of 8, pointers 16-byte aligned (indices 8-byte);
// anything else throws mok::Error before the launch. Asynchronous on
// `stream`, no host synchronisation.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace mok {

inline constexpr int kMaxScatterSources = 4;

struct ScatterRowsArgs {
  const void* sources[kMaxScatterSources] = {};
  void* outs[kMaxScatterSources] = {};
  int num_sources = 0;
  const int64_t* row_of_entry = nullptr;
  const int64_t* entry_of_row = nullptr;
  int64_t tokens = 0;
  int k = 0;
  int64_t num_rows = 0;
  int64_t width = 0;
  bool zero_unclaimed_rows = true;
};

void validate_scatter_rows(const ScatterRowsArgs& args);
void scatter_rows(const ScatterRowsArgs& args, CUstream_st* stream = nullptr);

}  // namespace mok
