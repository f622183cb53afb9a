// Block-scaled FP8 activation rows on the GPU: bf16 x [rows, cols] to e4m3
// values [rows, cols] and ue8m0 scales [rows, cols / 128], one scale per row
// and 128 columns -- include/mok/fp8.hpp's rule, bit for bit: the host's
// mok::fp8::quantize_rows gives the same bytes for the same (bf16) inputs.
// It is the A operand the FP8 grouped GEMM reads (GemmElement::kE4M3), and
// the same rule the fused FP8 forward's dispatch applies to the rows it
// stages (docs/fp8-forward-design.md, section 2).
// Host API only.
//
// cols a multiple of 128; x, values 16-byte aligned; rows * cols below 2^40.
// Non-finite inputs are not refused here (that would need a host sync): a
// NaN stays NaN in its byte (and does not affect its block's scale), an
// infinity makes its block's scale 2^127 and saturates. mok.quant's Python
// entry point refuses them before calling this.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace mok {

struct QuantizeRowsArgs {
  const void* x = nullptr;   // bf16 [rows, cols]
  uint8_t* values = nullptr; // e4m3 [rows, cols]
  uint8_t* scales = nullptr; // ue8m0 [rows, cols / 128]
  int64_t rows = 0;
  int64_t cols = 0;
};

// Throws mok::Error naming the first bad field; touches no device memory.
void validate_quantize_rows(const QuantizeRowsArgs& args);
// Validates, then enqueues one kernel on `stream`. Asynchronous.
void quantize_rows_e4m3(const QuantizeRowsArgs& args, CUstream_st* stream = nullptr);

}  // namespace mok
