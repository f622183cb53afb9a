// The fused backward's workspace: the options it runs with (the forward's,
// resolved, with its own dispatch default and whole-schedule buffers), every
// rank's regions in one allocation, and the bounds they imply. Plain C++ (no
// CUDA): tests/cpu/test_backward_layout.cpp checks it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mok/fused_backward.hpp"
#include "mok/fused_forward.hpp"
#include "mok/layer_config.hpp"
#include "protocol/pass_backward.hpp"
#include "world/kernel_facts.hpp"
#include "world/workspace_layout.hpp"

namespace mok::world {

// The backward's options from the forward's, already resolved
// (resolve_options): comm_ctas_per_rank, when the caller left it 0, twice the
// forward's rule (it pulls two rows, dout and x, per schedule row), at most a
// quarter of the rank's CTAs; ring_slots, as many minibatches as the largest
// schedule has (the buffers never wrap). Throws mok::Error when those
// buffers would pass 2^30 rows. `caller` is what the caller asked for.
FusedForwardOptions backward_options(const LayerConfig& config, const FusedForwardOptions& caller,
                                     const FusedForwardOptions& resolved, const KernelFacts& kernel);

// The pass shape the backward's geometry derives from.
protocol::PassShape backward_shape(const LayerConfig& config, const FusedForwardOptions& options,
                                   const KernelFacts& kernel);

// One rank's regions, from its base.
struct BackwardRankLayout {
  Region dout_rows;      // bf16 [buffer rows, H]
  Region x_rows;         // bf16 [buffer rows, H]
  Region w_rows;         // fp32 [buffer rows]
  Region d13_rows;       // bf16 [buffer rows, 2I]
  Region hw_rows;        // bf16 [buffer rows, I]
  Region dw_parts;       // fp32 [T k, parts]
  Region dx_rows;        // bf16 [buffer rows, H]: dx_j by schedule row (read by the home ranks' combine)
  Region dx_row_of;      // {owner, row} [T k]: where each (token, slot)'s dx_j lies (owners' dispatch)
  Region shared_d13;     // bf16 [T rounded up to tile_m, 2S]
  Region shared_h;       // bf16 [T rounded up to tile_m, S]
  Region shared_dx;      // bf16 [T, H]
  // Two counter sets (device-ordered passes take them in turns, host-ordered
  // ones set 0), each the backward table's counters (counter_words) and then
  // the combine's cursor (kCounterSetTailWords), and the world barrier's
  // words (device-ordered passes).
  Region counters[2];
  Region barrier;        // protocol::WorldBarrierWords
  // Process world only (else empty): this rank's inputs that its peers read,
  // staged by each pass (a caller's tensors are not IPC-visible).
  Region staged_x;        // bf16 [T, H]
  Region staged_dout;     // bf16 [T, H]
  Region staged_weights;  // fp32 [T, k]
  // The end of its schedule's expert offsets (the pass state's
  // expert_offset, [El + 1]): the combine of every rank reads an owner's
  // padded row count there.
  Region staged_expert_offset;  // int32 [El + 1]
  Region maps;           // CUtensorMap [protocol::num_backward_maps]
  // Recompute mode only (empty in save mode): where its recompute kinds keep
  // [gate | up], which its g tasks then read.
  Region kept_preact;         // bf16 [buffer rows, 2I], by schedule row
  Region kept_shared_preact;  // bf16 [T rounded up to tile_m, 2S]
  size_t bytes = 0;
  size_t counter_set_words = 0;  // uint32 words of each counter set
  // Without schedule rows: each sizes its mode's counters.
  protocol::PassGeometry<protocol::BackwardPass> geometry{};
  protocol::PassGeometry<protocol::BackwardRecomputePass> recompute_geometry{};
};

struct BackwardLayout {
  int64_t row_capacity = 0;  // schedule rows a rank may own (the forward's saved_rows())
  int64_t buffer_rows = 0;   // ring_slots x minibatch_rows >= row_capacity
  int parts = 0;             // n-tiles of I: the router weight's gradient parts per (token, slot)
  std::vector<BackwardRankLayout> ranks;
  std::vector<size_t> rank_offset;  // [R] from the allocation's base
  size_t bytes = 0;                 // the allocation
};

// Every rank's layout, for `options` = backward_options(...), in `mode`
// (its counters, its maps and, in recompute mode, its kept pre-activations;
// `staged_inputs`: room for the inputs peers read, in a process world).
// Throws mok::Error if a rank's pass could have 2^31 GEMM tasks or more.
BackwardLayout backward_layout(const LayerConfig& config, const FusedForwardOptions& options,
                               const KernelFacts& kernel, BackwardMode mode = BackwardMode::kSave,
                               bool staged_inputs = false);

// The layout's fingerprint, which a process world's ranks compare: the
// forward's rules (layout_fingerprint) and the backward's own (its mode, its
// buffers), so that a forward's handle and a backward's never mix.
uint64_t backward_fingerprint(const LayerConfig& config, const FusedForwardOptions& options,
                              const KernelFacts& kernel, BackwardMode mode);

// Words of a counter set past the table's counters: the combine's cursor
// (device::FusedBackwardParamsOf::kCounterSetTailWords; static_assert there).
inline constexpr size_t kCounterSetTailWords = 1;

// What must be zero before a rank's first pass: both counter sets and the
// barrier words (device-ordered passes never zero them from the host).
Region zeroed_at_creation(const BackwardRankLayout& layout);

// Every region of a rank's layout, in address order (for the checks).
std::vector<NamedRegion> regions(const BackwardRankLayout& layout);

}  // namespace mok::world
