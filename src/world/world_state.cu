#include "world/world_state.hpp"

#include <algorithm>

#include "common/cuda_check.hpp"
#include "protocol/counters.hpp"
#include "protocol/world_barrier.hpp"
#include "world/device_scope.hpp"
#include "world/pass_params.hpp"

namespace mok::world {

void WorldState::allocate_rank(int r) {
  // Both counter sets and the barrier words start at zero; device-ordered
  // passes never zero them from the host again.
  const RankLayout& L = layouts[static_cast<size_t>(r)];
  allocate_workspace(r, L.bytes, zeroed_at_creation(L));
  fill_view(r);
}

void WorldState::fill_params() {
  const LayerConfig& c = config;
  const FusedForwardOptions& o = options;
  device::FusedForwardParams& p = params;
  fill_pass_params(p, c, o, kernel.tile_m);
  p.n_major_kinds = n_major_kinds;
  if (trace_memory != nullptr) {
    p.trace_count = reinterpret_cast<uint32_t*>(trace_memory);
    p.trace = reinterpret_cast<TraceEvent*>(trace_memory + trace_count_bytes());
    p.trace_capacity = static_cast<uint32_t>(trace_per_block);
  }
  p.epoch = 0;
  p.barrier_timeout_ns = static_cast<uint64_t>(o.barrier_timeout_seconds * 1e9);
}

// Counters are bound per pass (bind_counters); a process world's peers
// expose their staged inputs as x and ids.
void WorldState::fill_view(int r) {
  const RankLayout& L = layouts[static_cast<size_t>(r)];
  uint8_t* base = rank_base[static_cast<size_t>(r)];
  device::RankView& v = params.ranks[r];
  v.tokens = config.tokens_per_rank[static_cast<size_t>(r)];
  v.ring_x = reinterpret_cast<uint16_t*>(base + L.ring_x.offset);
  v.ring_h = reinterpret_cast<uint16_t*>(base + L.ring_h.offset);
  v.combine = reinterpret_cast<uint16_t*>(base + L.combine.offset);
  v.shared_h = reinterpret_cast<uint16_t*>(base + L.shared_h.offset);
  v.shared_out = reinterpret_cast<uint16_t*>(base + L.shared_out.offset);
  use_pass_state(r, nullptr);
  v.schedule_hist = reinterpret_cast<int32_t*>(base + L.schedule_hist.offset);
  v.maps = reinterpret_cast<const CUtensorMap*>(base + L.maps.offset);
  v.barrier = reinterpret_cast<protocol::WorldBarrierWords*>(base + L.barrier.offset);
  // The FP8 forward's ring scales (its rings hold e4m3 bytes through the
  // same pointers); the weights' scales are the caller's, set per pass.
  const bool fp8 = config.dtype == DType::kFP8E4M3;
  params.fp8[r].ring_x_scales = fp8 ? base + L.ring_x_scales.offset : nullptr;
  params.fp8[r].ring_h_scales = fp8 ? base + L.ring_h_scales.offset : nullptr;
  if (kind == WorldKind::kProcess) {
    v.x = reinterpret_cast<const uint16_t*>(base + L.staged_x.offset);
    v.ids = reinterpret_cast<const int32_t*>(base + L.staged_ids.offset);
  }
}

void WorldState::use_pass_state(int r, void* state) {
  uint8_t* base = state != nullptr ? static_cast<uint8_t*>(state)
                                   : rank_base[static_cast<size_t>(r)] + layouts[static_cast<size_t>(r)].pass_state.offset;
  device::RankView& v = params.ranks[r];
  v.expert_rows = reinterpret_cast<int32_t*>(base + pass_state.expert_rows.offset);
  v.expert_offset = reinterpret_cast<int32_t*>(base + pass_state.expert_offset.offset);
  v.rows = reinterpret_cast<RowSource*>(base + pass_state.rows.offset);
}

// Host-ordered: every rank's set 0, with the world's abort flag and report in
// world_words. Device-ordered: set epoch % 2 of every rank, the world's abort
// flag and report being those of rank 0's set (so they outlive the pass until
// every host has read them; docs/protocol.md), and the other set idle.
void WorldState::bind_counters(uint32_t pass_epoch) {
  const int set = device_ordered() ? protocol::counter_set_of(pass_epoch) : 0;
  uint32_t* abort = world_words;
  auto* stall = reinterpret_cast<protocol::StallReport*>(world_words + 1);
  if (device_ordered()) {
    const protocol::ForwardCounters rank0 = protocol::carve_counters(
        layouts[0].geometry, reinterpret_cast<uint32_t*>(rank_base[0] + layouts[0].counters[set].offset));
    abort = rank0.abort;
    stall = rank0.stall;
  }
  for (int r = 0; r < config.world_size; ++r) {
    if (rank_base[static_cast<size_t>(r)] == nullptr) continue;
    const RankLayout& L = layouts[static_cast<size_t>(r)];
    device::RankView& v = params.ranks[r];
    uint8_t* base = rank_base[static_cast<size_t>(r)];
    v.counters = protocol::carve_counters(L.geometry, reinterpret_cast<uint32_t*>(base + L.counters[set].offset),
                                          abort, stall);
    v.idle_counters = reinterpret_cast<uint32_t*>(base + L.counters[1 - set].offset);
  }
}

void WorldState::zero_counters(int r, cudaStream_t stream) {
  if (r == 0) zero_report_words(stream);
  const RankLayout& L = layouts[static_cast<size_t>(r)];
  MOK_CUDA_CHECK(cudaMemsetAsync(rank_memory[static_cast<size_t>(r)] + L.counters[0].offset, 0,
                                 protocol::counter_words(L.geometry) * sizeof(uint32_t), stream));
}

}  // namespace mok::world
