// Row combine: each output row is the fp32 sum of an optional base row and k
// gathered rows, in slot order, rounded once to bf16 -- the home rank's sum
// of a token's per-slot results (the backward's dx = dx_shared + dx_0 + ... +
// dx_{k-1}; the forward's combine does the same inside the fused kernel).
// Host API only.
//
//   rows       bf16  [num_rows, width]   per-(token, slot) rows
//   row_index  int32 [tokens, k]         row of (token, slot); < 0: no contribution
//   base       bf16  [tokens, width]     added first; null: starts from 0
//   out        bf16  [tokens, width]     out[t] = bf16(((base[t] + rows[i_0]) + rows[i_1]) + ...)
//
// Deterministic: fixed order per element, no atomics. width a multiple of 8,
// pointers 16-byte aligned (row_index 4-byte), indices < num_rows (trusted:
// the caller built them); anything else throws mok::Error before the launch.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace mok {

struct RowCombineArgs {
  const void* rows = nullptr;
  const int32_t* row_index = nullptr;
  const void* base = nullptr;
  void* out = nullptr;
  int64_t num_rows = 0;
  int64_t tokens = 0;
  int k = 0;
  int64_t width = 0;
};

void validate_row_combine(const RowCombineArgs& args);
void row_combine(const RowCombineArgs& args, CUstream_st* stream = nullptr);

}  // namespace mok
