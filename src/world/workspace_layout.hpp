// The workspace of one rank of the fused forward: which region of its one
// allocation holds what, how big each is, and a fingerprint of everything
// that fixes the layout (ranks of a process world read each other's memory by
// it, so they must agree on it). Also the bounds the layout implies: the
// largest schedule a rank can receive and the 2^31-task bound of a pass.
// Plain C++ (no CUDA): tests/cpu/test_workspace_layout.cpp checks it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mok/fused_forward.hpp"
#include "mok/layer_config.hpp"
#include "protocol/pass_forward.hpp"
#include "world/kernel_facts.hpp"

namespace mok::world {

// Every region starts on this boundary (TMA bases need 16 B, tensor maps 64 B;
// 1 KB keeps rows of every tensor aligned for any swizzle).
inline constexpr size_t kRegionAlignment = 1024;
// Bumped whenever the carving below changes: it enters the fingerprint.
// 3: the FP8 forward's rings (e4m3 bytes) and their scale regions.
// 4: those scales k-block-major (protocol/ring_scales.hpp), no longer row-major.
inline constexpr uint32_t kLayoutVersion = 4;

inline size_t align_up(size_t value, size_t alignment) { return (value + alignment - 1) / alignment * alignment; }

struct Region {
  size_t offset = 0;
  size_t bytes = 0;
  size_t end() const { return offset + bytes; }
};

// A rank's pass state: what one pass leaves for a later pass of the same
// layer (its schedule; the backward will reuse it), at offsets from the
// state's base. The world keeps one of its own in each workspace, which every
// pass without a caller's state overwrites; a caller keeps one per layer.
struct PassStateLayout {
  Region expert_rows;    // int32 [El]: real rows per local expert
  Region expert_offset;  // int32 [El + 1]: padded offsets, the last one the schedule's padded rows
  Region rows;           // RowSource [row_capacity]: the schedule
  size_t bytes = 0;
};
// Regions of a pass state start on this boundary (the state's base needs 16 B).
inline constexpr size_t kPassStateAlignment = 256;
PassStateLayout pass_state_layout(const LayerConfig& config, const KernelFacts& kernel);

// The routed rings hold bf16 rows, or e4m3 rows in an fp8 layer
// (LayerConfig::dtype kFP8E4M3), each row's ue8m0 scales (one per 128
// columns) beside them in ring_x_scales / ring_h_scales (empty in bf16),
// k-block-major: [columns / 128][ring_scale_pitch(ring rows)]
// (protocol/ring_scales.hpp).
struct RankLayout {
  Region ring_x;         // bf16 / e4m3 [ring rows, H]
  Region ring_h;         // bf16 / e4m3 [ring rows, I]
  Region ring_x_scales;  // fp8: ue8m0 [H / 128, scale pitch], written by the dispatch (else empty)
  Region ring_h_scales;  // fp8: ue8m0 [I / 128, scale pitch], written by the gate/up epilogue (else empty)
  Region combine;        // bf16 [T * k, H]: y per (token, slot), written by the expert owners
  Region shared_h;       // bf16 [T rounded up to token_tile_m, S]
  Region shared_out;     // bf16 [T, H]
  Region pass_state;     // the world's own pass state (PassStateLayout)
  Region schedule_hist;  // int32 [schedule warps, El]: the schedule builders' scratch
  Region counters[2];    // two counter sets: set 0 only when host-ordered, epoch % 2 when device-ordered
  Region barrier;        // protocol::WorldBarrierWords
  Region maps;           // CUtensorMap [tensor_maps]
  Region staged_x;       // process world: this rank's x, where its peers can read it (else empty)
  Region staged_ids;     // process world: this rank's expert ids (else empty)
  size_t bytes = 0;      // the allocation
  protocol::ForwardGeometry geometry{};  // padded_rows unknown (0): sizes the counters only
  int64_t row_capacity = 0;
};

struct NamedRegion {
  const char* name;
  Region region;
};
// Every region of the layout, in address order.
std::vector<NamedRegion> regions(const RankLayout& layout);
// What is zeroed once, when the workspace is made: both counter sets and the
// barrier words (device-ordered passes never zero them from the host again).
Region zeroed_at_creation(const RankLayout& layout);

// The pass shape every rank's geometry derives from (the kernel facts of the
// layer's dtype: fused_kernel_facts(config.dtype)).
protocol::PassShape pass_shape(const LayerConfig& config, const FusedForwardOptions& options,
                               const KernelFacts& kernel);
// Throws mok::Error unless that shape's tile heights are those of the table
// the layer's dtype runs (protocol::shape_fits_tiles): the kernel computes
// its geometry from its table, the host lays the counters out by the facts.
void require_kernel_tiles(const LayerConfig& config, const FusedForwardOptions& options, const KernelFacts& kernel);
// The largest schedule any rank can receive: every (token, slot) entry of the
// world on its experts, each expert padded to tile_m. An upper bound even for
// invalid routing (ids repeated on another rank are caught by that rank after
// this one counted them), so the schedule never runs past its buffer.
int64_t schedule_row_capacity(const LayerConfig& config, const KernelFacts& kernel);
// The most GEMM tasks one rank's pass can have (counted in 64 bits).
int64_t most_tasks_per_pass(const LayerConfig& config, const FusedForwardOptions& options,
                            const KernelFacts& kernel);
// Tickets are decoded in 32 bits (protocol/pass_table.hpp): throws
// mok::Error for a shape whose pass could reach 2^31 tasks.
void require_task_bound(const LayerConfig& config, const FusedForwardOptions& options, const KernelFacts& kernel);

// Rank `rank`'s layout; `staged_inputs`: room for its x and ids (process world).
RankLayout rank_layout(const LayerConfig& config, const FusedForwardOptions& options, const KernelFacts& kernel,
                       int rank, bool staged_inputs);

// FNV-1a over every field that decides the layout of any rank's workspace,
// and over nothing else (two ranks must agree on all of them to read each
// other's memory; options that do not change the layout may differ).
uint64_t layout_fingerprint(const LayerConfig& config, const FusedForwardOptions& options,
                            const KernelFacts& kernel);

}  // namespace mok::world
