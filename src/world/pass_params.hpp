// What every fused kernel's parameters (the forward's FusedForwardParams, the
// backward's FusedBackwardParamsOf<Pass>) take from the layer and the
// resolved options alike, filled in one place. Host only.
#pragma once

#include <cstdint>

#include "mok/fused_forward.hpp"
#include "mok/layer_config.hpp"

namespace mok::world {

// The layer's dimensions, the tile rows and the pass geometry options (the
// caller sets first_rank, launch_ranks, the trace and its own fields).
template <class Params>
void fill_pass_params(Params& p, const LayerConfig& c, const FusedForwardOptions& o, int tile_m) {
  p.world_size = c.world_size;
  p.hidden = c.hidden;
  p.intermediate = c.intermediate;
  p.shared_width = c.shared_width();
  p.top_k = c.top_k;
  p.num_local_experts = c.experts_per_rank();
  p.tile_m = tile_m;
  p.minibatch_rows = o.minibatch_rows;
  p.ring_slots = o.ring_slots;
  p.lookahead = o.lookahead;
  p.ctas_per_rank = o.ctas_per_rank;
  p.comm_ctas_per_rank = o.comm_ctas_per_rank;
  p.n_major_kinds = 0;  // the forward sets its own (forward_n_major_kinds)
  p.timeout_ns = static_cast<uint64_t>(o.timeout_seconds * 1e9);
}

}  // namespace mok::world
