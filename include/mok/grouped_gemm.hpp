// Grouped GEMM on Hopper (bf16 in, fp32 accumulate, bf16 out): the tensor-core
// engine of the MoE layer, callable on its own. Host API only.
//
// Layout (all row-major, bf16 stored as uint16_t bits):
//   a     [m_total, k]           activation rows; group g owns rows
//                                [group_offset[g], group_offset[g] + group_rows[g])
//   b     plain : [G, n, k]      weights in nn.Linear layout (K contiguous), or, with
//                 [G, k, n]      b_layout kKN, the same weights transposed (N contiguous)
//         SwiGLU: [G, 2n, k]     w13: rows [0, n) gate, rows [n, 2n) up
//   out   [m_total, n]           plain : out = a . b[g]^T
//                                SwiGLU: out = silu(a . gate^T) * (a . up^T), fp32 math,
//                                        one bf16 rounding at the end
// group_offset (int32 [G + 1]) and group_rows (int32 [G]) live in DEVICE memory
// and are never read by the host (no synchronisation). Offsets need not be
// multiples of the tile height; rows between group_offset[g] + group_rows[g]
// and group_offset[g + 1] are padding and are never written, nor is any row at
// or past m_total. The device trusts: 0 <= group_offset[g] <= group_offset[g+1],
// group_offset[g] + group_rows[g] <= group_offset[g + 1] <= m_total, rows >= 0.
//
// Supported sizes: k and n multiples of 64 (k >= 64, n >= 64), 1 <= G; k, n,
// m_total and G * weight rows (n; 2n for SwiGLU) below 2^31 (see docs/gemm.md);
// a, b, out 16-byte aligned; group arrays 4-byte aligned. Anything else throws
// mok::Error before any launch.
//
// SwiGLU backward (epilogue kSwiGLUBackward; the data gradient through the
// down projection and the activation, docs/backward-design.md):
//   a       [m_total, k]   dout rows (k = H)
//   b       [G, k, n]      W2 as nn.Linear stores it ([H, I]), b_layout kKN
//   preact  [m_total, 2n]  the forward's [gate | up] pre-activations of each row
//   with acc = a . b[g] (fp32, = W2^T dout), w = row_scale[row] (1 if null),
//   s = 1 / (1 + e^-gate), h = gate * s * up, dh = w * acc:
//   out        [m_total, 2n] bf16  [dh * up * s * (1 + gate * (1 - s)) | dh * gate * s]
//   scaled_act [m_total, n]  bf16  w * h                        (null: not written)
//   row_scale_grad [m_total] fp32  sum over columns of acc * h  (null: not written),
//              summed per n-tile in a fixed order into `scratch`
//              ([m_total, swiglu_backward_parts(n)] fp32), then over the
//              n-tiles in order by a second kernel on the same stream.
//
// Determinism: a row's output depends only on that row and the weights: same
// bits whatever its offset, its group's size, the other rows or the grid size.
#pragma once

#include <cstdint>
#include <string>

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace mok {

// kSwiGLUQuantize (kE4M3 only; the FP8 forward's gate/up, docs/fp8-forward-
// design.md): out = e4m3(silu(gate) * up * 2^-e) [m_total, n] bytes, with
// out_scales ue8m0 [m_total, n / 128] holding each row's e per 128 columns:
// include/mok/fp8.hpp's rule over the row's 128 fp32 h values (amax <= 448 *
// 2^e, smallest e; round to nearest even). n a multiple of 128. A NaN in h
// stays NaN in its byte; infinities saturate.
enum class GemmEpilogue : int { kPlain = 0, kSwiGLU = 1, kSwiGLUBackward = 2, kSwiGLUQuantize = 3 };
// Operand element type. kE4M3: block-scaled FP8 (include/mok/fp8.hpp): a and
// b hold e4m3 bytes, a_scales ue8m0 [m_total, k / 128] (one per row and 128
// of K), b_scales ue8m0 [G, n / 128, k / 128] (one per 128 x 128 block;
// SwiGLU: [G, 2n / 128, k / 128] over w13's 2n rows); the plain, SwiGLU or
// SwiGLU-quantize epilogue, b as [G, n, k] ([G, 2n, k]) only; k a multiple
// of 128, n of 128 (SwiGLU: of 64; fp8_split_n: of 256). Each 128-deep
// block of K is summed by the tensor cores, then scaled and added to an
// fp32 accumulator on the CUDA cores (gemm/fp8_mainloop.cuh).
enum class GemmElement : int { kBF16 = 0, kE4M3 = 1 };
// How b is stored: kNK = [G, n, k] (the nn.Linear layout); kKN = [G, k, n]
// (the plain and kSwiGLUBackward epilogues; what a data gradient reads:
// dx = dy . W).
enum class WeightLayout : int { kNK = 0, kKN = 1 };

struct GroupedGemmArgs {
  const void* a = nullptr;              // bf16 [m_total, k]
  const void* b = nullptr;              // bf16 [G, n, k] or [G, 2n, k] (SwiGLU)
  void* out = nullptr;                  // bf16 [m_total, n]
  const int32_t* group_offset = nullptr;  // device int32 [G + 1]
  const int32_t* group_rows = nullptr;    // device int32 [G]
  int num_groups = 0;                   // G
  int64_t m_total = 0;                  // rows of a and out
  int64_t n = 0;                        // output columns
  int64_t k = 0;                        // reduction length
  GemmEpilogue epilogue = GemmEpilogue::kPlain;
  WeightLayout b_layout = WeightLayout::kNK;
  // kSwiGLUBackward only (see above); out is then [m_total, 2n].
  // kE4M3 only (see GemmElement).
  GemmElement element = GemmElement::kBF16;
  const uint8_t* a_scales = nullptr;   // ue8m0 [m_total, k / 128]
  const uint8_t* b_scales = nullptr;   // ue8m0 [G, n / 128, k / 128]
  uint8_t* out_scales = nullptr;       // kSwiGLUQuantize: ue8m0 [m_total, n / 128]
  const void* preact = nullptr;        // bf16 [m_total, 2n]
  const float* row_scale = nullptr;    // fp32 [m_total]; null = every row's weight is 1
  void* scaled_act = nullptr;          // bf16 [m_total, n]; null = not written
  float* row_scale_grad = nullptr;     // fp32 [m_total]; null = not written
  float* scratch = nullptr;            // fp32 [m_total, swiglu_backward_parts(n)]; needed with row_scale_grad
  int max_ctas = 0;  // persistent CTAs to launch; 0 = one per SM (results never depend on it)
  // kE4M3, plain epilogue, n a multiple of 256: run the 2-CTA variant, whose
  // clusters share each A box by TMA multicast (the same bits; fewer L2
  // bytes). It launches whole clusters: max_ctas is rounded down to an even
  // count, and 1 still launches one cluster of two. Off by default: GPU
  // tested (the same bits), but measured at 0.57x the one-CTA tile's speed
  // (docs/perf-notes.md q2).
  // Ignored where it does not apply.
  bool fp8_multicast = false;
  // kE4M3, plain epilogue: run the split-N tile instead of the default 128 x
  // 128: 64 rows x 256 weight rows a tile, its two consumer warpgroups
  // computing output columns [n0, n0 + 128) and [n0 + 128, n0 + 256) of the
  // same rows (docs/gemm.md; the tile the fused FP8 forward's first kernel
  // used -- it now runs the wide 128 x 256 tiles). Every element is the same wgmma sequence and
  // promotion as in the 128 x 128 tile: the same bits. n a multiple of 256;
  // not with fp8_multicast; anything else throws mok::Error. Off by default:
  // GPU tested (the same bits), 5% slower than 128 x 128 on the DeepSeek-V3
  // down shape (docs/perf-notes.md q3).
  bool fp8_split_n = false;
  // Row tiles per raster band inside a group (tile order only; results never
  // depend on it). 0 = $MOK_GEMM_BAND if set, else 8.
  int raster_band = 0;
};

// The compile-time tile shape chosen for an epilogue, for printing and docs.
struct GroupedGemmConfig {
  int block_m = 0;         // rows per tile
  int block_n = 0;         // weight rows per tile (SwiGLU: half gate, half up)
  int block_k = 0;
  int out_cols = 0;        // output columns per tile
  int stages = 0;          // TMA pipeline depth
  int consumer_warpgroups = 0;
  int threads = 0;
  int smem_bytes = 0;
  std::string describe() const;
};

GroupedGemmConfig grouped_gemm_config(GemmEpilogue epilogue);

// Columns of the kSwiGLUBackward scratch: one fp32 part of <acc, h> per n-tile.
int64_t swiglu_backward_parts(int64_t n);

// Throws mok::Error naming the first bad field; touches no device memory.
void validate_grouped_gemm(const GroupedGemmArgs& args);

// Validates, then enqueues one persistent kernel on `stream` (nullptr = the
// legacy default stream). Asynchronous: no host synchronisation.
void grouped_gemm(const GroupedGemmArgs& args, CUstream_st* stream = nullptr);

}  // namespace mok
