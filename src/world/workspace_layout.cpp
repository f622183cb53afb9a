#include "world/workspace_layout.hpp"

#include <algorithm>
#include <string>

#include "mok/error.hpp"
#include "mok/fp8.hpp"
#include "mok/row_source.hpp"
#include "protocol/counters.hpp"
#include "protocol/pass_forward_fp8.hpp"
#include "protocol/ring_scales.hpp"
#include "protocol/world_barrier.hpp"
#include "world/pass_tiles.hpp"

namespace mok::world {
namespace {

// Carves aligned regions out of one allocation, in call order.
struct Carver {
  size_t offset = 0;
  Region take(size_t count, size_t element_bytes) {
    Region r;
    r.offset = align_up(offset, kRegionAlignment);
    r.bytes = count * element_bytes;
    offset = r.end();
    return r;
  }
  template <class T>
  Region take(size_t count) {
    return take(count, sizeof(T));
  }
};

size_t to_size(int64_t v) { return static_cast<size_t>(v); }

}  // namespace

std::vector<NamedRegion> regions(const RankLayout& L) {
  return {{"ring_x", L.ring_x},
          {"ring_h", L.ring_h},
          {"ring_x_scales", L.ring_x_scales},
          {"ring_h_scales", L.ring_h_scales},
          {"combine", L.combine},
          {"shared_h", L.shared_h},
          {"shared_out", L.shared_out},
          {"pass_state", L.pass_state},
          {"schedule_hist", L.schedule_hist},
          {"counters[0]", L.counters[0]},
          {"counters[1]", L.counters[1]},
          {"barrier", L.barrier},
          {"maps", L.maps},
          {"staged_x", L.staged_x},
          {"staged_ids", L.staged_ids}};
}

Region zeroed_at_creation(const RankLayout& L) {
  return Region{L.counters[0].offset, L.barrier.end() - L.counters[0].offset};
}

protocol::PassShape pass_shape(const LayerConfig& config, const FusedForwardOptions& options,
                               const KernelFacts& kernel) {
  protocol::PassShape s{kernel.tile_m, options.minibatch_rows, options.ring_slots, options.lookahead,
                        config.hidden, config.intermediate, config.shared_width()};
  // As the kernel's RoleContext::shape says it (shape_token_tile_m): 0, "the
  // m-tile", unless the own-token kinds' tiles are taller (the FP8 forward's).
  s.token_tile_m = kernel.token_tile_m != kernel.tile_m ? kernel.token_tile_m : 0;
  return s;
}

void require_kernel_tiles(const LayerConfig& config, const FusedForwardOptions& options, const KernelFacts& kernel) {
  const protocol::PassShape s = pass_shape(config, options, kernel);
  const bool fits = config.dtype == DType::kFP8E4M3 ? protocol::shape_fits_tiles<protocol::ForwardFp8Pass>(s)
                                                    : protocol::shape_fits_tiles<protocol::ForwardPass>(s);
  if (!fits) {
    throw Error(std::string("fused forward: kernel facts with m-tile ") + std::to_string(kernel.tile_m) +
                " and token tile " + std::to_string(kernel.token_tile_m) + " are not the " + dtype_name(config.dtype) +
                " forward table's tiles (take them from fused_kernel_facts(config.dtype))");
  }
}

int64_t schedule_row_capacity(const LayerConfig& config, const KernelFacts& kernel) {
  return config.total_tokens() * config.top_k + static_cast<int64_t>(config.experts_per_rank()) * (kernel.tile_m - 1);
}

int64_t most_tasks_per_pass(const LayerConfig& config, const FusedForwardOptions& options,
                            const KernelFacts& kernel) {
  const int most_tokens = *std::max_element(config.tokens_per_rank.begin(), config.tokens_per_rank.end());
  // The shared tasks of the rank with the most tokens, plus the routed tasks
  // of the largest schedule any rank can have, as the table of the layer's
  // dtype counts them.
  const protocol::PassShape shape = pass_shape(config, options, kernel);
  const int64_t rows = schedule_row_capacity(config, kernel);
  return config.dtype == DType::kFP8E4M3
             ? protocol::max_task_count<protocol::ForwardFp8Pass>(shape, most_tokens, rows)
             : protocol::max_task_count<protocol::ForwardPass>(shape, most_tokens, rows);
}

void require_task_bound(const LayerConfig& config, const FusedForwardOptions& options, const KernelFacts& kernel) {
  const int64_t tasks = most_tasks_per_pass(config, options, kernel);
  if (tasks > 0x7fffffff) {
    throw Error("fused forward: a pass of this shape could have " + std::to_string(tasks) +
                " GEMM tasks; at most 2^31 - 1 are supported (fewer tokens per pass)");
  }
}

PassStateLayout pass_state_layout(const LayerConfig& config, const KernelFacts& kernel) {
  const size_t El = to_size(config.experts_per_rank());
  PassStateLayout S;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    Region r{align_up(at, kPassStateAlignment), bytes};
    at = r.end();
    return r;
  };
  S.expert_rows = take(El * sizeof(int32_t));
  S.expert_offset = take((El + 1) * sizeof(int32_t));
  S.rows = take(to_size(schedule_row_capacity(config, kernel)) * sizeof(RowSource));
  S.bytes = align_up(at, kPassStateAlignment);
  return S;
}

RankLayout rank_layout(const LayerConfig& config, const FusedForwardOptions& o, const KernelFacts& kernel, int rank,
                       bool staged_inputs) {
  const size_t H = to_size(config.hidden), I = to_size(config.intermediate), S = to_size(config.shared_width());
  const size_t k = to_size(config.top_k), El = to_size(config.experts_per_rank());
  const int32_t tokens = config.tokens_per_rank[static_cast<size_t>(rank)];
  const size_t T = to_size(tokens);
  const size_t ring_rows = to_size(o.ring_slots) * to_size(o.minibatch_rows);
  const size_t element = routed_element_bytes(config.dtype);
  const bool quantized = config.dtype == DType::kFP8E4M3;
  RankLayout L;
  L.geometry = protocol::forward_geometry(pass_shape(config, o, kernel), tokens, 0);
  L.row_capacity = schedule_row_capacity(config, kernel);
  Carver c;
  L.ring_x = c.take(ring_rows * H, element);
  L.ring_h = c.take(ring_rows * I, element);
  // k-block-major (protocol/ring_scales.hpp): a tile's scales at one k-block
  // are one bulk copy's contiguous bytes.
  static_assert(fp8::kBlock == 128, "ring_scales.hpp counts 128-column blocks");
  auto scale_bytes = [&](int32_t columns) {
    return quantized ? to_size(protocol::ring_scale_bytes(static_cast<int64_t>(ring_rows), columns)) : 0;
  };
  L.ring_x_scales = c.take<uint8_t>(scale_bytes(config.hidden));
  L.ring_h_scales = c.take<uint8_t>(scale_bytes(config.intermediate));
  L.combine = c.take<uint16_t>(T * k * H);
  L.shared_h = c.take<uint16_t>(align_up(T, to_size(kernel.token_tile_m)) * S);
  L.shared_out = c.take<uint16_t>(T * H);
  L.pass_state = c.take(1, pass_state_layout(config, kernel).bytes);
  L.schedule_hist = c.take<int32_t>(to_size(o.comm_ctas_per_rank) * to_size(kernel.schedule_warps_per_cta) * El);
  L.counters[0] = c.take<uint32_t>(protocol::counter_words(L.geometry));
  L.counters[1] = c.take<uint32_t>(protocol::counter_words(L.geometry));
  L.barrier = c.take<protocol::WorldBarrierWords>(1);
  L.maps = c.take(to_size(kernel.tensor_maps), kernel.tensor_map_bytes);
  L.staged_x = c.take<uint16_t>(staged_inputs ? T * H : 0);
  L.staged_ids = c.take<int32_t>(staged_inputs ? T * k : 0);
  L.bytes = align_up(c.offset, kRegionAlignment);
  return L;
}

uint64_t layout_fingerprint(const LayerConfig& c, const FusedForwardOptions& o, const KernelFacts& kernel) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](int64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= static_cast<uint64_t>(v >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  };
  mix(kLayoutVersion);
  mix(kernel.tile_m);
  mix(kernel.token_tile_m);
  mix(kernel.schedule_warps_per_cta);
  mix(kernel.tensor_maps);
  mix(static_cast<int64_t>(kernel.tensor_map_bytes));
  mix(c.hidden);
  mix(c.intermediate);
  mix(c.num_experts);
  mix(c.top_k);
  mix(c.shared_width());
  mix(static_cast<int64_t>(c.dtype));  // the rings' element size and their scale regions
  mix(c.world_size);
  for (int t : c.tokens_per_rank) mix(t);
  mix(o.minibatch_rows);
  mix(o.ring_slots);
  // Every rank's schedule is built by comm_ctas_per_rank CTAs (its workspace
  // and its peers' counter targets depend on it).
  mix(o.comm_ctas_per_rank);
  return h;
}

}  // namespace mok::world
