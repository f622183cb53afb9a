#include "world/backward_layout.hpp"

#include <algorithm>
#include <string>

#include "mok/error.hpp"
#include "protocol/counters.hpp"
#include "protocol/world_barrier.hpp"
#include "world/forward_options.hpp"

namespace mok::world {
namespace {

using protocol::BackwardPass;
using protocol::BackwardRecomputePass;

size_t to_size(int64_t v) { return static_cast<size_t>(v); }

}  // namespace

FusedForwardOptions backward_options(const LayerConfig& config, const FusedForwardOptions& caller,
                                     const FusedForwardOptions& resolved, const KernelFacts& kernel) {
  FusedForwardOptions o = resolved;
  if (caller.comm_ctas_per_rank == 0) {
    // Twice the forward's rule: the dispatch must be done within the
    // pipeline's share of the pass (the finale's weight gradients read no
    // new rows). On the DeepSeek-V3 slice 4 -> 8 CTAs took the pass from
    // 14.5 to 13.3 ms (docs/perf-notes.md b5).
    o.comm_ctas_per_rank = std::max(1, std::min(2 * resolved.comm_ctas_per_rank, resolved.ctas_per_rank / 4));
  }
  const int64_t capacity = schedule_row_capacity(config, kernel);
  const int64_t mb = o.minibatch_rows;
  const int64_t slots = (capacity + mb - 1) / mb;
  if (slots * mb > kMaxRingRows) {
    throw Error("FusedBackward: the schedule's " + std::to_string(capacity) +
                " rows exceed what one pass's buffers may hold (2^30 rows)");
  }
  o.ring_slots = static_cast<int>(slots);
  return o;
}

protocol::PassShape backward_shape(const LayerConfig& config, const FusedForwardOptions& options,
                                   const KernelFacts& kernel) {
  return protocol::PassShape{kernel.tile_m,        options.minibatch_rows, options.ring_slots,
                             options.lookahead,    config.hidden,          config.intermediate,
                             config.shared_width(), config.experts_per_rank()};
}

BackwardLayout backward_layout(const LayerConfig& config, const FusedForwardOptions& options,
                               const KernelFacts& kernel, BackwardMode mode, bool staged_inputs) {
  const bool recompute = mode == BackwardMode::kRecompute;
  BackwardLayout L;
  L.row_capacity = schedule_row_capacity(config, kernel);
  L.buffer_rows = static_cast<int64_t>(options.ring_slots) * options.minibatch_rows;
  const int out_cols = protocol::kBackwardGradTile.out_cols();
  L.parts = (config.intermediate + out_cols - 1) / out_cols;
  const protocol::PassShape shape = backward_shape(config, options, kernel);
  const size_t H = to_size(config.hidden), I = to_size(config.intermediate), S = to_size(config.shared_width()),
               k = to_size(config.top_k), P = to_size(L.buffer_rows), parts = to_size(L.parts);
  size_t offset = 0;
  for (int r = 0; r < config.world_size; ++r) {
    const int32_t tokens = config.tokens_per_rank[static_cast<size_t>(r)];
    const int64_t tasks = recompute ? protocol::max_task_count<BackwardRecomputePass>(shape, tokens, L.row_capacity)
                                    : protocol::max_task_count<BackwardPass>(shape, tokens, L.row_capacity);
    if (tasks > 0x7fffffff) {
      throw Error("FusedBackward: rank " + std::to_string(r) + "'s pass could have " + std::to_string(tasks) +
                  " GEMM tasks; tickets are 32-bit (at most 2^31 - 1)");
    }
    BackwardRankLayout g;
    g.geometry = protocol::pass_geometry<BackwardPass>(shape, tokens, 0);
    g.recompute_geometry = protocol::pass_geometry<BackwardRecomputePass>(shape, tokens, 0);
    size_t at = 0;
    auto take = [&](Region& region, size_t bytes) {
      region.offset = at;
      region.bytes = bytes;
      at = align_up(at + bytes, kRegionAlignment);
    };
    const size_t T = to_size(tokens), T_pad = align_up(T, to_size(kernel.tile_m));
    take(g.dout_rows, P * H * 2);
    take(g.x_rows, P * H * 2);
    take(g.w_rows, P * 4);
    take(g.d13_rows, P * 2 * I * 2);
    take(g.hw_rows, P * I * 2);
    take(g.dw_parts, T * k * parts * 4);
    take(g.dx_rows, P * H * 2);
    take(g.dx_row_of, T * k * 8);
    take(g.shared_d13, T_pad * 2 * S * 2);
    take(g.shared_h, T_pad * S * 2);
    take(g.shared_dx, T * H * 2);
    // Two counter sets (device-ordered passes use them in turns; host-ordered
    // ones set 0), each with the combine's cursor after its counters, then
    // the barrier words: one contiguous region, zeroed at creation.
    g.counter_set_words =
        (recompute ? protocol::counter_words(g.recompute_geometry) : protocol::counter_words(g.geometry)) +
        kCounterSetTailWords;
    take(g.counters[0], g.counter_set_words * sizeof(uint32_t));
    take(g.counters[1], g.counter_set_words * sizeof(uint32_t));
    take(g.barrier, sizeof(protocol::WorldBarrierWords));
    take(g.staged_x, staged_inputs ? T * H * 2 : 0);
    take(g.staged_dout, staged_inputs ? T * H * 2 : 0);
    take(g.staged_weights, staged_inputs ? T * k * 4 : 0);
    take(g.staged_expert_offset, staged_inputs ? (to_size(config.experts_per_rank()) + 1) * 4 : 0);
    take(g.maps, to_size(recompute ? protocol::num_backward_maps<BackwardRecomputePass>()
                                   : protocol::num_backward_maps<BackwardPass>()) *
                     kernel.tensor_map_bytes);
    take(g.kept_preact, recompute ? P * 2 * I * 2 : 0);
    take(g.kept_shared_preact, recompute ? T_pad * 2 * S * 2 : 0);
    g.bytes = at;
    L.rank_offset.push_back(offset);
    offset = align_up(offset + g.bytes, kRegionAlignment);
    L.ranks.push_back(g);
  }
  L.bytes = offset;
  return L;
}

std::vector<NamedRegion> regions(const BackwardRankLayout& g) {
  return {{"dout_rows", g.dout_rows},   {"x_rows", g.x_rows},           {"w_rows", g.w_rows},
          {"d13_rows", g.d13_rows},     {"hw_rows", g.hw_rows},         {"dw_parts", g.dw_parts},
          {"dx_rows", g.dx_rows},       {"dx_row_of", g.dx_row_of}, {"shared_d13", g.shared_d13},   {"shared_h", g.shared_h},
          {"shared_dx", g.shared_dx},   {"counters[0]", g.counters[0]}, {"counters[1]", g.counters[1]},
          {"barrier", g.barrier},       {"staged_x", g.staged_x},       {"staged_dout", g.staged_dout},
          {"staged_weights", g.staged_weights}, {"staged_expert_offset", g.staged_expert_offset},
          {"maps", g.maps},             {"kept_preact", g.kept_preact}, {"kept_shared_preact", g.kept_shared_preact}};
}

uint64_t backward_fingerprint(const LayerConfig& config, const FusedForwardOptions& options,
                              const KernelFacts& kernel, BackwardMode mode) {
  // The forward's fingerprint covers the layer and the options both passes
  // share; the backward's buffers follow from them and its mode.
  constexpr uint64_t kBackwardTag = 0x6d6f6b6261636bull;  // "mokback"
  const uint64_t mode_bits = (static_cast<uint64_t>(mode) + 1) * 0x9e3779b97f4a7c15ull;
  return layout_fingerprint(config, options, kernel) ^ kBackwardTag ^ mode_bits;
}

Region zeroed_at_creation(const BackwardRankLayout& g) {
  return Region{g.counters[0].offset, g.barrier.end() - g.counters[0].offset};
}

}  // namespace mok::world
