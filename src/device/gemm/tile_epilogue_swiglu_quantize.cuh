// The FP8 gate/up epilogue: h = silu(gate) * up, quantized to e4m3 with one
// ue8m0 scale per row and 128 columns -- the A operand of the FP8 down GEMM
// (docs/fp8-forward-design.md, section 3).
//
// The tile is split-N (GemmTileShape::splits_n): 64 rows; consumer
// warpgroup 0 holds the 128 gate columns [n0, n0 + 128) of every row,
// warpgroup 1 the 128 up columns. h needs both, so they hand each other
// half: warpgroup 0's warps 2-3 put their gate values (rows 32..63) in
// shared memory for warpgroup 1, whose warps 0-1 put their up values (rows
// 0..31) there for warpgroup 0. Then warpgroup 0's warps 0-1 finish rows
// 0..31 and warpgroup 1's warps 2-3 rows 32..63, each thread a fixed 64
// (row, column) pairs: the very fragment positions the other warp held, so
// the exchange is thread to thread, lane-contiguous, free of bank conflicts.
//
// Per row (include/mok/fp8.hpp's rule, which the host quantizer and the CPU
// reference apply): amax over its 128 h values (a max: order-free); e the
// smallest exponent with amax <= 448 * 2^e (0 for an all-zero row), clamped
// to [-127, 127]; each value e4m3(h * 2^-e), round to nearest even,
// saturating (2^-e is exact, so is the product up to the final rounding).
// h itself is the bf16 path's formula (silu_mul). A row's bytes depend
// only on the row: the same wherever it sits.
//
// Only rows [tile.row0, tile.row_end) are written, as in store_tile.
#pragma once

#include <cstdint>

#include "device/gemm/fp8_mainloop.cuh"
#include "device/gemm/tile_config.cuh"
#include "device/gemm/tile_epilogue.cuh"
#include "device/ptx/named_barrier.cuh"
#include "device/ptx/vector_io.cuh"
#include "device/quant/e4m3.cuh"
#include "device/sched/grouped_tiles.cuh"

namespace mok::device {

// The exchange: afterwards the finisher warps (warpgroup 0's warps 0-1,
// warpgroup 1's warps 2-3) hold h = silu(gate) * up of their rows in `acc`;
// returns whether this warp is one. `exchange` holds kRounds x ... floats:
// with one round (the grouped GEMM, Cfg::kExchangeFloats of its own) both
// halves move at once; with two (the fused FP8 forward, whose shared memory
// has room for half: the consumer warps' 16 KB of staging) first the up
// values for warpgroup 0, then the gate values for warpgroup 1, each round
// between two barriers. The arithmetic per element is the same either way.
template <class Cfg, int kRounds>
__device__ __forceinline__ bool swiglu_exchange(float (&acc)[Cfg::kAccRegs], float* exchange, int consumer,
                                                int barrier_id) {
  static_assert(kRounds == 1 || kRounds == 2);
  constexpr int kRegs = Cfg::kAccRegs;
  constexpr int kRegion = 2 * kRegs * 32;  // floats: two warps' fragments
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32) % 4;
  // Rows 0..31 are warps 0-1's, finished by warpgroup 0; rows 32..63 warps
  // 2-3's, finished by warpgroup 1.
  const bool finisher = consumer == 0 ? warp < 2 : warp >= 2;
  // Region 0 holds up values for warpgroup 0, region 1 gate values for
  // warpgroup 1: a non-finisher writes the other warpgroup's region, a
  // finisher reads its own.
  const int region = finisher ? consumer : 1 - consumer;
#pragma unroll
  for (int round = 0; round < kRounds; ++round) {
    const bool active = kRounds == 1 || region == round;
    float* const at = exchange + (kRounds == 1 ? region * kRegion : 0) + (warp % 2) * kRegs * 32 + lane;
    if (!finisher && active) {
#pragma unroll
      for (int i = 0; i < kRegs; ++i) at[i * 32] = acc[i];
    }
    named_barrier_sync(barrier_id, 256);
    if (finisher && active) {
#pragma unroll
      for (int i = 0; i < kRegs; ++i) {
        const float partner = at[i * 32];
        acc[i] = consumer == 0 ? silu_mul(acc[i], partner) : silu_mul(partner, acc[i]);
      }
    }
    // The next round (or the finishers' stores, when the exchange is the
    // staging) reuses the area only after every read.
    if (kRounds > 1) named_barrier_sync(barrier_id, 256);
  }
  return finisher;
}

// Where the tile's 128-column block of scales goes: row r's byte at
// base[r * row_stride + block]. Row-major scales [rows][n / 128] (the grouped
// GEMM's, the caller's layout): row_stride = n / 128, block = n0 / 128; the
// fused forward's k-block-major ring (protocol/ring_scales.hpp): row_stride =
// 1, block = (n0 / 128) * pitch.
struct ScaleColumn {
  uint8_t* base;
  int64_t row_stride;
  int64_t block;
};
__device__ __forceinline__ ScaleColumn row_major_scales(uint8_t* scales, const GemmTile& tile, int n) {
  return ScaleColumn{scales, n / 128, tile.n0 / 128};
}

// A finisher warp: its 16 rows of h, each row's 128 values quantized with
// the row's scale, through its staging, to values[row * n + tile.n0 ..] and
// the row's byte of `scales`. h_of(i) is element i of the warp's m64n128
// fragment: h_of(4j + 2hh + e) is row (warp * 16 + lane / 4 + 8 hh), column
// 8j + 2 (lane % 4) + e, so a row's 128 columns sit in its quad of lanes.
// The rows go one half (hh) at a time, h made as it is needed: where h_of
// computes h (the wide tile's SwiGLU, two MUFU operations a value), half 0's
// maximum, quantizing and staging stores run beside half 1's MUFU work, and
// only one half's values are live. `tile.row0` is the first row of the warp's
// warpgroup (the wide tile's warpgroup 1: the tile's row 64).
template <class Cfg, class HOf>
__device__ __forceinline__ void store_quantized_h_rows(const HOf& h_of, GemmSharedStorage<Cfg>& smem, int consumer,
                                                       const GemmTile& tile, uint8_t* values,
                                                       const ScaleColumn& scales, int n) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32) % 4;
  // The warp's 16 rows x 128 bytes through its staging, 16-byte chunks
  // XOR-swizzled by row, then whole 128-byte lines to global memory.
  const uint32_t base = shared_address(smem.staging[consumer * 4 + warp]);
  int32_t e[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float h[32];  // h[2j + x]: fragment element 4j + 2hh + x
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int x = 0; x < 2; ++x) h[2 * j + x] = h_of(4 * j + 2 * hh + x);
    }
    // The row's maximum |h| (a max: any order gives the same value), four
    // chains of eight, then the quad's four lanes.
    float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 32; ++i) m[i % 4] = fmaxf(m[i % 4], fabsf(h[i]));
    float amax = fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    e[hh] = fp8_scale_exponent(amax);
    const float inv = ue8m0_value(static_cast<uint32_t>(127 - e[hh]));  // 2^-e, exact
    const int r = lane / 4 + 8 * hh;
    // Byte 8j + 2 (lane % 4) of row r lies in 16-byte chunk (j / 2) ^ (r & 7)
    // of the row's 128 bytes: the staging is 128-byte aligned, so the chunk
    // index is bits 4-6 of the address, set by one XOR a store.
    const uint32_t row_at = (base + r * 128 + 2 * (lane % 4)) | ((r & 7) << 4);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint16_t q = pack_e4m3x2(__fmul_rn(h[2 * j], inv), __fmul_rn(h[2 * j + 1], inv));
      const uint32_t at = (row_at ^ ((j / 2) << 4)) + 8 * (j % 2);
      asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(at), "h"(q) : "memory");
    }
  }
  __syncwarp();
  const int first_row = tile.row0 + warp * 16;
  const int c = lane & 7;
#pragma unroll
  for (int it = 0; it < 4; ++it) {
    const int r = it * 4 + (lane >> 3);
    const uint4 v = ld_shared_v4(base + r * 128 + ((c ^ (r & 7)) * 16));
    if (first_row + r < tile.row_end) st_global_v4(values + static_cast<int64_t>(first_row + r) * n + tile.n0 + c * 16, v);
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = first_row + lane / 4 + 8 * hh;
    if (lane % 4 == 0 && row < tile.row_end) {
      scales.base[static_cast<int64_t>(row) * scales.row_stride + scales.block] = static_cast<uint8_t>(127 + e[hh]);
    }
  }
  __syncwarp();  // the staging is reused by the next tile's writes
}

// `values` e4m3 [m_total][n], `scales` the tile's block of ue8m0 scales;
// `exchange` Cfg::kExchangeFloats of shared memory (kRounds 1), or half of
// that (kRounds 2: it may be the staging itself); barrier_id names a barrier
// of the 256 consumer threads (both warpgroups call this for every tile).
template <class Cfg, int kRounds = 1>
__device__ __forceinline__ void store_swiglu_quantize_tile(const float (&acc)[Cfg::kAccRegs],
                                                           GemmSharedStorage<Cfg>& smem, float* exchange,
                                                           int consumer,
                                                           const GemmTile& tile, uint8_t* values,
                                                           const ScaleColumn& scales, int n, int barrier_id) {
  static_assert(Cfg::kSplitN && Cfg::kAccRegs == 64, "the split-N FP8 gate/up tile: 64 rows x 128 columns a warpgroup");
  float h[Cfg::kAccRegs];
#pragma unroll
  for (int i = 0; i < Cfg::kAccRegs; ++i) h[i] = acc[i];
  if (swiglu_exchange<Cfg, kRounds>(h, exchange, consumer, barrier_id)) {
    store_quantized_h_rows<Cfg>([&](int i) { return h[i]; }, smem, consumer, tile, values, scales, n);
  }
  // The exchange (and the staging) is read before either warpgroup's next
  // tile writes it (with short K a warpgroup could otherwise finish its next
  // K loop first).
  named_barrier_sync(barrier_id, 256);
}

// The wide FP8 gate/up tile (128 x 256, rows split: mma_fp8_wide_tile):
// each warpgroup holds the gate (acc[0, 64)) and the up (acc[64, 128))
// columns of the same 64 rows, so every warp finishes its own 16 rows --
// no hand-over between the warpgroups, no barrier between them. h is made
// row half by row half inside the store (store_quantized_h_rows): the
// quantizing of one half runs beside the other's MUFU work (docs/perf-notes.md
// v28: the epilogue had 327 instructions after its last MUFU operation).
template <class Cfg>
__device__ __forceinline__ void store_swiglu_quantize_wide_tile(const float (&acc)[Cfg::kAccRegs],
                                                                GemmSharedStorage<Cfg>& smem, int consumer,
                                                                const GemmTile& tile, uint8_t* values,
                                                                const ScaleColumn& scales, int n) {
  static_assert(!Cfg::kSplitN && Cfg::kBlockM == 128 && Cfg::kAccRegs == 128,
                "the wide FP8 gate/up tile: 64 rows x (128 gate + 128 up) columns a warpgroup");
  GemmTile rows = tile;
  rows.row0 = tile.row0 + consumer * 64;
  store_quantized_h_rows<Cfg>([&](int i) { return silu_mul(acc[i], acc[64 + i]); }, smem, consumer, rows, values,
                              scales, n);
}

}  // namespace mok::device
