// Grouped weight-gradient GEMM on Hopper (bf16 in, fp32 out): for each group
// g, the sum over its rows of the outer products a[r]^T b[r] -- what the
// backward of a grouped linear layer needs for its weights:
//   dW2[e]  = sum_r dy[r]^T h[r]     (a = dy rows [.., H], b = h rows [.., I])
//   dW13[e] = sum_r d13[r]^T x[r]    (a = [da | db] rows [.., 2I], b = x rows [.., H])
// Host API only.
//
//   a    bf16 [m_total, m]   row-major; group g owns rows
//   b    bf16 [m_total, n]   [group_offset[g], group_offset[g] + group_rows[g])
//   out  fp32 [G, m, n]      out[g] = sum_r a[r]^T b[r]   (accumulate: out[g] += ...)
//        or bf16 [G, m, n] with out_bf16: the fp32 sum rounded once (what an
//        autograd backward returns for bf16 weights); accumulate: that rounded
//        sum added to out_bf16 and rounded again -- the bits of torch adding
//        the returned gradient to a bf16 .grad (gradient accumulation), with
//        no second pass over the gradient
// group_offset (int32 [G + 1]) and group_rows (int32 [G]) live in DEVICE
// memory, as for grouped_gemm (same rules; rows outside every group are never
// read into a sum). A group with no rows gets zeros (accumulate: is left as is).
//
// Determinism: each output element is one fp32 accumulator chain over its
// group's rows in order, in 64-row blocks from the group's first row (wgmma
// k16 steps inside a block), then -- when accumulating -- one addition to the
// old value (bf16 out: of the rounded sum, by the TMA unit at L2; one such
// addition per element and call, so no order of additions to fix). The bits
// depend only on the group's rows, never on where the group sits in a, on the
// other groups or on the grid size.
//
// Supported sizes: m and n multiples of 64 (>= 64), G >= 1, G * m * n below
// 2^32 elements in fewer than 2^31 tiles; a, b and out 16-byte aligned, the
// group arrays 4-byte. Anything else throws mok::Error before any launch.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace mok {

struct WeightGradArgs {
  const void* a = nullptr;                // bf16 [m_total, m]
  const void* b = nullptr;                // bf16 [m_total, n]
  float* out = nullptr;                   // fp32 [G, m, n] (null when out_bf16 is given)
  void* out_bf16 = nullptr;               // bf16 [G, m, n] instead of out
  const int32_t* group_offset = nullptr;  // device int32 [G + 1]
  const int32_t* group_rows = nullptr;    // device int32 [G]
  int num_groups = 0;
  int64_t m_total = 0;
  int64_t m = 0;
  int64_t n = 0;
  bool accumulate = false;  // out[g] += the sum (gradient accumulation over micro-batches)
  int max_ctas = 0;         // persistent CTAs; 0 = one per SM (results never depend on it)
};

// Throws mok::Error naming the first bad field; touches no device memory.
void validate_weight_grad(const WeightGradArgs& args);

// Validates, then enqueues one persistent kernel on `stream`. Asynchronous.
void grouped_weight_grad(const WeightGradArgs& args, CUstream_st* stream = nullptr);

}  // namespace mok
