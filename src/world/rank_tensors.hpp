// Checks on the tensors a caller passes to run(), before anything is
// enqueued: pointers that must exist and be 16-byte aligned (TMA bases).
#pragma once

#include "mok/fused_forward.hpp"
#include "mok/layer_config.hpp"

namespace mok::world {

// Throws mok::Error naming the rank and the field.
void check_rank_tensors(const LayerConfig& config, const RankTensors& tensors, int rank);

// The rank's token count in this pass: tensors.tokens, or the layer's
// tokens_per_rank[rank] (its capacity) when that is -1.
int pass_tokens(const LayerConfig& config, const RankTensors& tensors, int rank);

// A pass's token count `tokens` for rank `rank` (RankTensors::tokens or
// BackwardRankTensors::tokens): -1 means the layer's tokens_per_rank[rank],
// which is otherwise the capacity. Throws mok::Error, prefixed by `who`,
// outside [-1, capacity]; returns the count.
int checked_pass_tokens(const LayerConfig& config, int tokens, int rank, const std::string& who);

// Whether a tensor the rank's tensor maps describe has moved (maps are
// rebuilt only then).
bool tensor_maps_moved(const RankTensors& before, const RankTensors& now);

}  // namespace mok::world
