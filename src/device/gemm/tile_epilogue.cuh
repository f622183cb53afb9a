// Tile epilogues: fp32 accumulators -> bf16 -> shared staging (stmatrix) ->
// 16-byte global stores, 64 output columns at a time per warp.
//
// Only rows [tile.row0, tile.row_end) and columns [0, n_cols) are written:
// padding rows between groups, and the next group's rows when a tile
// straddles a group boundary, are never touched. (This is why there is no TMA
// store: its box would overwrite them.)
//
// Rounding is spelled out with _rn intrinsics so no compiler contraction can
// make two code paths round differently:
//   plain : bf16_rn(acc)
//   SwiGLU: bf16_rn( (gate * sigmoid(gate)) * up ), with sigmoid below
//           (ex2.approx and rcp.approx, 2 ulp each: the bits of __expf and
//           __fdividef) and the products __fmul_rn. Reference: silu(g) =
//           g / (1 + exp(-g)).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "device/gemm/tile_config.cuh"
#include "device/ptx/stmatrix.cuh"
#include "device/ptx/vector_io.cuh"
#include "device/sched/grouped_tiles.cuh"

namespace mok::device {

// 1 / (1 + e^-gate) in fp32, the forward's and the backward's SwiGLU alike:
// two MUFU operations (ex2, rcp) and two rounded arithmetic ones. These are
// the bits of the libdevice form __fdividef(1, __fadd_rn(1, __expf(-gate)))
// for every fp32 gate (tests/gpu/test_swiglu_math.cu runs all 2^32), in 6
// instructions against 13: the form without .ftz adds range fix-ups for a
// subnormal e^-gate (gate > 87: 1 + e is 1 either way) and for a divisor
// past 2^126 (gate < -87: the flushed reciprocal is the 0 the fix-up
// returns), which cannot change the result here. __expf's multiply by log2(e)
// is kept as it was (rounded once; -gate * c and gate * -c are the same).
// gate < -88: e^-gate = +inf, sigmoid +0, silu -0, as it should.
__device__ __forceinline__ float sigmoid(float gate) {
  float e, s;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(__fmul_rn(gate, -1.44269504088896340736f)));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(s) : "f"(__fadd_rn(1.0f, e)));
  return s;
}

// silu(gate) * up in fp32; the formula the CPU references reproduce.
__device__ __forceinline__ float silu_mul(float gate, float up) {
  return __fmul_rn(__fmul_rn(gate, sigmoid(gate)), up);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Output chunk j (8 columns), row half h of this thread's fragment, as two
// packed bf16.
template <class Cfg>
__device__ __forceinline__ uint32_t epilogue_pair(const float (&acc)[Cfg::kAccRegs], int j, int h) {
  const int i = 4 * j + 2 * h;
  if constexpr (Cfg::kEpilogue == EpilogueKind::kSwiGLU) {
    constexpr int kUp = 4 * (Cfg::kBlockN / 16);  // up columns sit BN/2 after their gate columns
    return pack_bf16x2(silu_mul(acc[i], acc[i + kUp]), silu_mul(acc[i + 1], acc[i + 1 + kUp]));
  } else {
    return pack_bf16x2(acc[i], acc[i + 1]);
  }
}

// A tile epilogue whose rows go wherever the caller says: row i of the tile
// (0..BM-1) is stored at row_ptr(i) + column, or not at all when row_ptr(i)
// is null. The routed down GEMM of the fused kernel uses it to put each
// (token, slot) result straight into its home rank's combine row; contiguous
// outputs are the special case below (store_tile).
// Consumer warpgroup `consumer` stores its 64 rows; columns [col0, col0 +
// kOutCols) of the tile, clipped to n_cols (a multiple of 64). A split-N
// tile's warpgroups share the tile's 64 rows instead: warpgroup c stores all
// of them, columns [col0 + 128 c, col0 + 128 c + 128) (mma_fp8_tile gave it
// those weight rows), clipped the same way.
// `pack(j, h)` gives output chunk j, row half h of this thread's fragment as
// two packed bf16 (epilogue_pair by default; the forward's training mode also
// stores the raw gate and up accumulators of a SwiGLU tile this way).
template <class Cfg, class RowPtr, class Pack>
__device__ __forceinline__ void store_tile_rows_of(const Pack& pack, GemmSharedStorage<Cfg>& smem, int consumer,
                                                   int col0, int n_cols, const RowPtr& row_ptr) {
  static_assert(!Cfg::kSplitN || !Cfg::kGateUp,
                "a split-N gate/up tile's warpgroups hold gate and up of the same columns: "
                "store_swiglu_quantize_tile stores it");
  const int warp = (threadIdx.x / 32) % 4;
  // This warp's first row within the tile and this warpgroup's first column.
  // Chosen at compile time: the row-split tiles (every bf16 one) keep the
  // code they had before split-N tiles existed.
  int first_row, col_first;
  if constexpr (Cfg::kSplitN) {
    first_row = warp * 16;
    col_first = col0 + consumer * (Cfg::kOutCols / 2);
  } else {
    first_row = consumer * 64 + warp * 16;
    col_first = col0;
  }
  // 64-column slabs of this warpgroup: its fragment's columns, 64 x 16 at a time.
  constexpr int kSlabs = (Cfg::kSplitN ? Cfg::kOutCols / 2 : Cfg::kOutCols) / 64;
  uint8_t* const staging = smem.staging[consumer * 4 + warp];

  // The four rows this lane stores (rows it * 4 + lane / 8 of the warp's 16),
  // resolved once for every slab.
  uint16_t* dst[4];
#pragma unroll
  for (int it = 0; it < 4; ++it) dst[it] = row_ptr(first_row + it * 4 + static_cast<int>(threadIdx.x % 32) / 8);

  // Per slab: stage, read back all four 16-byte chunks, then store all four.
  // The reads are issued back to back and each store waits only for its own
  // data, so a slab costs one shared-memory round trip rather than four
  // chained ones (the reads used to be generic loads of a pointer the
  // compiler could not place in shared memory, each one waited for, with its
  // address reloaded from local memory, before the next).
#pragma unroll
  for (int slab = 0; slab < kSlabs; ++slab) {
    const int c0 = col_first + slab * 64;
    if (c0 >= n_cols) break;  // warp-uniform
    const int lane = static_cast<int>(threadIdx.x % 32);
    const uint32_t base = shared_address(staging);
    // stmatrix: this lane gives row st_row of chunk 2 * pair + st_chunk.
    const int st_row = ((lane >> 3) & 1) * 8 + (lane & 7);
    const int st_chunk = lane >> 4;
#pragma unroll
    for (int pair = 0; pair < 4; ++pair) {
      const int j = slab * 8 + 2 * pair;
      const int chunk = 2 * pair + st_chunk;
      stmatrix_x4(base + st_row * 128 + ((chunk ^ (st_row & 7)) * 16), pack(j, 0), pack(j, 1), pack(j + 1, 0),
                  pack(j + 1, 1));
    }
    __syncwarp();
    // Read-out: this lane moves 16-byte chunk c of its four rows.
    const int c = lane & 7;
    uint4 v[4];
#pragma unroll
    for (int it = 0; it < 4; ++it) {
      const int r = it * 4 + (lane >> 3);
      v[it] = ld_shared_v4(base + r * 128 + ((c ^ (r & 7)) * 16));
    }
    // Every lane's reads precede the next slab's stmatrix into the same bytes.
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 4; ++it) {
      if (dst[it] != nullptr) st_global_v4(dst[it] + c0 + c * 8, v[it]);
    }
  }
}

template <class Cfg, class RowPtr>
__device__ __forceinline__ void store_tile_rows(const float (&acc)[Cfg::kAccRegs],
                                                GemmSharedStorage<Cfg>& smem, int consumer,
                                                int col0, int n_cols, const RowPtr& row_ptr) {
  store_tile_rows_of<Cfg>([&](int j, int h) { return epilogue_pair<Cfg>(acc, j, h); }, smem, consumer, col0, n_cols,
                          row_ptr);
}

// A SwiGLU tile's raw accumulators, rounded once to bf16: the gate columns
// (up = false) or the up columns (true) of output chunk j, row half h.
template <class Cfg>
__device__ __forceinline__ uint32_t preactivation_pair(const float (&acc)[Cfg::kAccRegs], int j, int h, bool up) {
  static_assert(Cfg::kGateUp && !Cfg::kSplitN, "a gate/up tile: gate columns, then up columns, in each warpgroup");
  constexpr int kUp = 4 * (Cfg::kBlockN / 16);  // as in epilogue_pair
  const int i = 4 * j + 2 * h + (up ? kUp : 0);
  return pack_bf16x2(acc[i], acc[i + 1]);
}

// Consumer warpgroup `consumer` writes its 64 rows of the tile (split N:
// its 128 columns of the tile's 64 rows) into the row-major out[m_total,
// n_cols]: rows [tile.row0, tile.row_end) only.
template <class Cfg>
__device__ __forceinline__ void store_tile(const float (&acc)[Cfg::kAccRegs],
                                           GemmSharedStorage<Cfg>& smem, int consumer,
                                           const GemmTile& tile, uint16_t* out, int n_cols) {
  store_tile_rows<Cfg>(acc, smem, consumer, tile.n0, n_cols, [&](int i) -> uint16_t* {
    const int row = tile.row0 + i;
    return row < tile.row_end ? out + static_cast<int64_t>(row) * n_cols : nullptr;
  });
}

}  // namespace mok::device
