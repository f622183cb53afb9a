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
// epilogue rounds alike: s = sigmoid(gate) as in the forward's silu_mul;
// each part sums the thread's columns in ascending order, then the four
// lanes of a row in a fixed butterfly (a + b == b + a bitwise, so every lane
// ends with the same value).
//
// Only rows [tile.row0, tile.row_end) and columns below n are read or
// written, as in store_tile.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "device/gemm/tile_config.cuh"
#include "device/gemm/tile_epilogue.cuh"
#include "device/ptx/bulk_copy.cuh"
#include "device/ptx/stmatrix.cuh"
#include "device/ptx/vector_io.cuh"
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
  const float s = sigmoid(gate);
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
//
// Data movement. Each warp moves its 16 rows through its own 2 KB of shared
// staging (smem.staging[consumer * 4 + warp], as store_tile_rows_of does), so
// that every global load and store instruction moves whole 128-byte row
// segments, four rows of them. Straight from the accumulator layout (row
// lane / 4 + 8 h; 4 bytes at column 2 (lane % 4) of each 8-column chunk) each
// instruction touched 8 rows x 16 bytes, ~320 of them per thread per
// 128 x 256 tile, and the epilogue took ~26 us of a ~110 us task on an H200.
//
// The unit is a half-slab: 8 rows (h = 0: the warp's rows 0-7, h = 1: 8-15)
// x 64 columns, 1 KB per array, so the staging holds two arrays at once.
// Per half-slab:
//  - its gate and up lines (two 16-byte chunks a lane of each, loaded during
//    the previous half-slab) go into the staging's first and second KB, and
//    ldmatrix reads them back in the accumulator layout;
//  - the next half-slab's lines are loaded, so that they are in flight during
//    this one's arithmetic and stores (loaded after the stores they would
//    wait behind them: the compiler cannot tell preact from d13,
//    docs/perf-notes.md b3);
//  - each pair of 8-column chunks is computed, and stmatrix puts its da and
//    db where its gate and up were;
//  - da's and db's lines are read and stored, then w h goes the same way
//    through the first KB.
// Besides the prefetched lines (16 registers) a thread holds the half-slab's
// gate and up (16, used up pair by pair), w h (8) and the lines on their way
// out: the 128 accumulator registers stay allocated through the epilogue, and
// 16-row slabs (32 input and 48 output registers) spilled. Each KB is
// XOR-swizzled in 16-byte chunks by row, so neither the line side nor the
// matrix side has bank conflicts.
//
// The arithmetic is unchanged, element by element in the accumulator layout,
// and so are the bits: each part sums the thread's columns in ascending order
// (the half-slabs of a row come in column order).
template <class Cfg, class PartAddress>
__device__ __forceinline__ void store_swiglu_backward_tile(const float (&acc)[Cfg::kAccRegs],
                                                           GemmSharedStorage<Cfg>& smem, int consumer,
                                                           const GemmTile& tile, const SwigluBackwardOutputs& o,
                                                           const PartAddress& part_address) {
  static_assert(Cfg::kEpilogue == EpilogueKind::kSwiGLUBackward);
  static_assert(Cfg::kOutCols % 64 == 0, "whole 64-column slabs");
  static_assert(Cfg::kStagingBytesPerWarp == 2 * 1024, "two 1 KB arrays of 8 rows x 64 bf16 columns");
  constexpr int kSteps = 2 * (Cfg::kOutCols / 64);  // half-slabs: step = 2 slab + h
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32) % 4;
  const int first_row = tile.row0 + consumer * 64 + warp * 16;  // the warp's 16 rows
  const uint32_t staging = shared_address(smem.staging[consumer * 4 + warp]);

  // Line layout (global memory <-> staging): this lane moves 16-byte chunk c
  // of rows it * 4 + lane / 8 (it = 0, 1) of the half-slab's 8, eight lanes a
  // row; line_at is where that chunk lies in the first KB (+ 1024: second).
  const int c = lane & 7;
  uint32_t line_at[2];
#pragma unroll
  for (int it = 0; it < 2; ++it) {
    const int r = it * 4 + (lane >> 3);
    line_at[it] = staging + r * 128 + ((c ^ r) * 16);
  }
  // Fragment layout (staging <-> registers): an ldmatrix / stmatrix x4 moves
  // four 8 x 8 matrices; this lane gives the address of row lane % 8 of
  // matrix lane / 8, and register k holds row lane / 4, columns 2 (lane % 4)
  // and + 1 of matrix k: the accumulators' (chunk j, half h) pair
  // acc[4 j + 2 h], acc[4 j + 2 h + 1] for that chunk and half.
  // pair_at(p): matrices {KB 0, KB 1} x {chunk 2 p, 2 p + 1}, i.e. registers
  // (gate or da of 2 p, of 2 p + 1, up or db of 2 p, of 2 p + 1).
  // quad_at(q): chunks 4 q .. 4 q + 3 of the first KB.
  const int m_row = lane & 7;
  auto pair_at = [&](int p) {
    const int chunk = 2 * p + ((lane >> 3) & 1);
    return staging + (lane >> 4) * 1024 + m_row * 128 + ((chunk ^ m_row) * 16);
  };
  auto quad_at = [&](int q) {
    const int chunk = 4 * q + (lane >> 3);
    return staging + m_row * 128 + ((chunk ^ m_row) * 16);
  };

  // The thread's two fragment rows: lane / 4 + 8 h of the warp's 16.
  float w[2], part[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = first_row + lane / 4 + 8 * h;
    w[h] = row < tile.row_end && o.row_scale != nullptr ? o.row_scale[row] : 1.0f;
  }

  // Half-slab `step`'s gate and up lines. Rows past row_end are not read:
  // their lines stay zero, and what the fragment computes for them is never
  // stored.
  uint4 gate_lines[2], up_lines[2];
  auto load_lines = [&](int step) {
    const int col = tile.n0 + (step / 2) * 64 + c * 8;
#pragma unroll
    for (int it = 0; it < 2; ++it) {
      const int row = first_row + 8 * (step % 2) + it * 4 + (lane >> 3);
      gate_lines[it] = make_uint4(0u, 0u, 0u, 0u);
      up_lines[it] = make_uint4(0u, 0u, 0u, 0u);
      if (row < tile.row_end) {
        const uint16_t* const p = o.preact + static_cast<int64_t>(row) * 2 * o.n + col;
        // Through L2 (ld.cg), not the read-only path: in the recompute
        // backward this pass wrote them (on other SMs) after it began.
        gate_lines[it] = __ldcg(reinterpret_cast<const uint4*>(p));
        up_lines[it] = __ldcg(reinterpret_cast<const uint4*>(p + o.n));
      }
    }
  };

  if (tile.n0 < o.n) load_lines(0);
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int slab = step / 2, h = step % 2;
    const int col = tile.n0 + slab * 64;
    if (col >= o.n) break;  // warp-uniform; n is a multiple of 64
    // Each __syncwarp orders every lane's accesses of the staging before the
    // other lanes' next ones to the same bytes.
#pragma unroll
    for (int it = 0; it < 2; ++it) {
      st_shared_v4(line_at[it], gate_lines[it]);
      st_shared_v4(line_at[it] + 1024, up_lines[it]);
    }
    __syncwarp();
    uint32_t frag[4][4];  // [p]: gate 2 p, gate 2 p + 1, up 2 p, up 2 p + 1
#pragma unroll
    for (int p = 0; p < 4; ++p) ldmatrix_x4(pair_at(p), frag[p][0], frag[p][1], frag[p][2], frag[p][3]);
    __syncwarp();
    // The next half-slab's loads, in flight during this one's work.
    if (step + 1 < kSteps && tile.n0 + ((step + 1) / 2) * 64 < o.n) load_lines(step + 1);

    uint32_t hw[8];  // w h of chunk jj of the slab
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      uint32_t da[2], db[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int jj = 2 * p + e;
        const int j = slab * 8 + jj;
        const float2 g = unpack_bf16x2(frag[p][e]);
        const float2 u = unpack_bf16x2(frag[p][2 + e]);
        float da0, db0, da1, db1;
        const float h0 = swiglu_backward(acc[4 * j + 2 * h], w[h], g.x, u.x, da0, db0);
        const float h1 = swiglu_backward(acc[4 * j + 2 * h + 1], w[h], g.y, u.y, da1, db1);
        part[h] = __fadd_rn(part[h], __fmul_rn(acc[4 * j + 2 * h], h0));
        part[h] = __fadd_rn(part[h], __fmul_rn(acc[4 * j + 2 * h + 1], h1));
        da[e] = pack_bf16x2(da0, da1);
        db[e] = pack_bf16x2(db0, db1);
        hw[jj] = pack_bf16x2(__fmul_rn(w[h], h0), __fmul_rn(w[h], h1));
      }
      // Where pair p's gate and up were (every lane read them before the
      // __syncwarp above): da into the first KB, db into the second.
      stmatrix_x4(pair_at(p), da[0], da[1], db[0], db[1]);
    }
    __syncwarp();
    uint4 v[2][2];  // [da, db][it]
#pragma unroll
    for (int it = 0; it < 2; ++it) {
      v[0][it] = ld_shared_v4(line_at[it]);
      v[1][it] = ld_shared_v4(line_at[it] + 1024);
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 2; ++it) {
      const int row = first_row + 8 * h + it * 4 + (lane >> 3);
      if (row < tile.row_end) {
        uint16_t* const to = o.d13 + static_cast<int64_t>(row) * 2 * o.n + col + c * 8;
        st_global_v4(to, v[0][it]);
        st_global_v4(to + o.n, v[1][it]);
      }
    }
    if (o.scaled_act != nullptr) {
#pragma unroll
      for (int q = 0; q < 2; ++q) stmatrix_x4(quad_at(q), hw[4 * q], hw[4 * q + 1], hw[4 * q + 2], hw[4 * q + 3]);
      __syncwarp();
#pragma unroll
      for (int it = 0; it < 2; ++it) v[0][it] = ld_shared_v4(line_at[it]);
      __syncwarp();
#pragma unroll
      for (int it = 0; it < 2; ++it) {
        const int row = first_row + 8 * h + it * 4 + (lane >> 3);
        if (row < tile.row_end) st_global_v4(o.scaled_act + static_cast<int64_t>(row) * o.n + col + c * 8, v[0][it]);
      }
    }
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // The row's four lanes (lane % 4) hold its column parts: a fixed butterfly.
    float p = part[h];
    p = __fadd_rn(p, __shfl_xor_sync(0xffffffffu, p, 1));
    p = __fadd_rn(p, __shfl_xor_sync(0xffffffffu, p, 2));
    const int row = first_row + lane / 4 + 8 * h;
    if (row < tile.row_end && lane % 4 == 0) {
      float* const to = part_address(row);
      if (to != nullptr) *to = p;
    }
  }
}

// Lane `lane` of a warp's share of bringing a tile's epilogue inputs into
// L2 ahead of the epilogue: the gate and up segments (the tile's columns, 512
// bytes each at 256 columns) of every real row, rows lane, lane + 32, ...,
// and (lane 0) the rows' weights.
// The epilogue reads each line once, through L2, with only one half-slab's
// loads ahead of their use, so straight from DRAM most of their latency is
// exposed; a prefetch issued a few k-blocks before the K loop ends lets them
// hit L2. Only a hint: nothing waits for it and no bit depends on it.
template <class Cfg>
__device__ __forceinline__ void prefetch_swiglu_backward_inputs(const GemmTile& tile, const SwigluBackwardOutputs& o,
                                                                int lane) {
  if (tile.n0 >= o.n) return;
  if (lane == 0 && o.row_scale != nullptr) {  // the rows' weights, in whole 16-byte chunks (none past the end)
    const uint32_t scale_bytes = static_cast<uint32_t>((tile.row_end - tile.row0) * 4) & ~15u;
    if (tile.row0 % 4 == 0 && scale_bytes > 0) bulk_prefetch_l2(o.row_scale + tile.row0, scale_bytes);
  }
  const uint32_t bytes = static_cast<uint32_t>(min(Cfg::kOutCols, o.n - tile.n0)) * 2;  // n: a multiple of 64
  for (int row = tile.row0 + lane; row < tile.row_end; row += 32) {
    const uint16_t* const gate = o.preact + static_cast<int64_t>(row) * 2 * o.n + tile.n0;
    bulk_prefetch_l2(gate, bytes);
    bulk_prefetch_l2(gate + o.n, bytes);
  }
}

template <class Cfg>
__device__ __forceinline__ void store_swiglu_backward_tile(const float (&acc)[Cfg::kAccRegs],
                                                           GemmSharedStorage<Cfg>& smem, int consumer,
                                                           const GemmTile& tile, const SwigluBackwardOutputs& o) {
  store_swiglu_backward_tile<Cfg>(acc, smem, consumer, tile, o, [&](int row) -> float* {
    return o.parts != nullptr ? o.parts + static_cast<int64_t>(row) * o.parts_cols + tile.n0 / Cfg::kOutCols
                              : nullptr;
  });
}

}  // namespace mok::device
