// The SwiGLU-backward tile epilogue: the accumulators hold acc = W2^T dout
// for the tile's rows and n-tile columns (the grouped GEMM with W2 read
// k-by-n); with the row's routing weight w and its saved pre-activations
// (gate, up) it writes the three things the rest of the backward reads:
//   d13[r] = [da | db]      da = dh * up * s * (1 + gate * (1 - s)),
//                           db = dh * gate * s,  dh = w * acc,
//                           s = 1 / (1 + e^-gate)             (bf16)
//   scaled_act[r] = w * h   h = gate * s * up                  (bf16)
//   parts[r][tile] = sum of acc * h over the tile's columns    (fp32)
// parts is d loss / d w's share of this n-tile: <dout, W2 h> = <acc, h>.
//
// Fixed arithmetic (explicit _rn, no contraction), so every caller of this
// epilogue rounds alike: s = __fdividef(1, 1 + __expf(-gate)) as in the
// forward's silu_mul; each part sums the thread's columns in ascending order,
// then the four lanes of a row in a fixed butterfly (a + b == b + a bitwise,
// so every lane ends with the same value).
//
// Only rows [tile.row0, tile.row_end) are read or written, as in store_tile.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "device/gemm/tile_config.cuh"
#include "device/gemm/tile_epilogue.cuh"
#include "device/sched/grouped_tiles.cuh"

namespace mok::device {

struct SwigluBackwardOutputs {
  const uint16_t* preact;  // bf16 [m_total][2n]: gate columns, then up columns
  const float* row_scale;  // fp32 [m_total]; null: every weight is 1
  uint16_t* d13;           // bf16 [m_total][2n]
  uint16_t* scaled_act;    // bf16 [m_total][n]; null: not written
  float* parts;            // fp32 [m_total][parts_cols]; null: not written
  int n;                   // I: columns of acc, half the columns of preact and d13
  int parts_cols;          // n-tiles of n
};

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t v) {
  __nv_bfloat162 b;
  *reinterpret_cast<uint32_t*>(&b) = v;
  return __bfloat1622float2(b);
}

// One column's SwiGLU backward; returns h and writes da, db.
__device__ __forceinline__ float swiglu_backward(float acc, float w, float gate, float up, float& da, float& db) {
  const float s = __fdividef(1.0f, __fadd_rn(1.0f, __expf(-gate)));
  const float silu = __fmul_rn(gate, s);
  const float h = __fmul_rn(silu, up);
  const float dh = __fmul_rn(w, acc);
  const float dsilu = __fmul_rn(s, __fadd_rn(1.0f, __fmul_rn(gate, __fsub_rn(1.0f, s))));  // d silu / d gate
  da = __fmul_rn(__fmul_rn(dh, up), dsilu);
  db = __fmul_rn(dh, silu);
  return h;
}

// part_address(row): where row's part of this n-tile goes (null: nowhere);
// the overload below puts it at o.parts[row][n-tile], the fused backward at
// the row's home (token, slot).
template <class Cfg, class PartAddress>
__device__ __forceinline__ void store_swiglu_backward_tile(const float (&acc)[Cfg::kAccRegs], int consumer,
                                                           const GemmTile& tile, const SwigluBackwardOutputs& o,
                                                           const PartAddress& part_address) {
  static_assert(Cfg::kEpilogue == EpilogueKind::kSwiGLUBackward);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32) % 4;
  const int chunks = min(Cfg::kOutCols, o.n - tile.n0) / 8;  // 8-column chunks inside n (n % 64 == 0)
  const int col0 = tile.n0 + 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = tile.row0 + consumer * 64 + warp * 16 + lane / 4 + 8 * h;
    const bool real = row < tile.row_end;
    float part = 0.0f;
    if (real) {
      const float w = o.row_scale != nullptr ? o.row_scale[row] : 1.0f;
      const int64_t base2 = static_cast<int64_t>(row) * 2 * o.n;
      const uint32_t* gate_in = reinterpret_cast<const uint32_t*>(o.preact + base2 + col0);
      const uint32_t* up_in = reinterpret_cast<const uint32_t*>(o.preact + base2 + o.n + col0);
      uint32_t* da_out = reinterpret_cast<uint32_t*>(o.d13 + base2 + col0);
      uint32_t* db_out = reinterpret_cast<uint32_t*>(o.d13 + base2 + o.n + col0);
      uint32_t* hw_out = o.scaled_act != nullptr
                             ? reinterpret_cast<uint32_t*>(o.scaled_act + static_cast<int64_t>(row) * o.n + col0)
                             : nullptr;
      // Eight chunks at a time: their 16 pre-activation loads are issued
      // together, then the chunks are computed and stored in order. Loading
      // each chunk just before its use made every load wait behind the
      // previous chunk's stores (the compiler cannot tell preact from d13),
      // ~2 x 32 dependent global round trips per row: the GEMM ran at 468
      // TFLOP/s where the same mainloop with a plain epilogue gives ~725
      // (docs/perf-notes.md b3). chunks is a multiple of 8 (n % 64 == 0).
#pragma unroll
      for (int j0 = 0; j0 < Cfg::kOutCols / 8; j0 += 8) {
        if (j0 < chunks) {
          uint32_t gate_bits[8], up_bits[8];
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) {
            gate_bits[jj] = __ldg(gate_in + 4 * (j0 + jj));
            up_bits[jj] = __ldg(up_in + 4 * (j0 + jj));
          }
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) {
            const int j = j0 + jj;
            const float2 gate = unpack_bf16x2(gate_bits[jj]);  // 8 columns = 4 bf16 pairs per chunk
            const float2 up = unpack_bf16x2(up_bits[jj]);
            float da0, db0, da1, db1;
            const float h0 = swiglu_backward(acc[4 * j + 2 * h], w, gate.x, up.x, da0, db0);
            const float h1 = swiglu_backward(acc[4 * j + 2 * h + 1], w, gate.y, up.y, da1, db1);
            part = __fadd_rn(part, __fmul_rn(acc[4 * j + 2 * h], h0));
            part = __fadd_rn(part, __fmul_rn(acc[4 * j + 2 * h + 1], h1));
            da_out[4 * j] = pack_bf16x2(da0, da1);
            db_out[4 * j] = pack_bf16x2(db0, db1);
            if (hw_out != nullptr) hw_out[4 * j] = pack_bf16x2(__fmul_rn(w, h0), __fmul_rn(w, h1));
          }
        }
      }
    }
    // The row's four lanes (lane % 4) hold its column parts: a fixed butterfly.
    part = __fadd_rn(part, __shfl_xor_sync(0xffffffffu, part, 1));
    part = __fadd_rn(part, __shfl_xor_sync(0xffffffffu, part, 2));
    if (real && lane % 4 == 0) {
      float* const to = part_address(row);
      if (to != nullptr) *to = part;
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void store_swiglu_backward_tile(const float (&acc)[Cfg::kAccRegs], int consumer,
                                                           const GemmTile& tile, const SwigluBackwardOutputs& o) {
  store_swiglu_backward_tile<Cfg>(acc, consumer, tile, o, [&](int row) -> float* {
    return o.parts != nullptr ? o.parts + static_cast<int64_t>(row) * o.parts_cols + tile.n0 / Cfg::kOutCols
                              : nullptr;
  });
}

}  // namespace mok::device
