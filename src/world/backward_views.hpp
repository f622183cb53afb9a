// A FusedBackward's rank views in the kernel's parameters (either mode's
// table: Params is FusedBackwardParams or FusedBackwardRecomputeParams): the
// workspace pointers of a rank, the counters bound for a pass, the report a
// device-ordered pass leaves, and what the process world's handle exchange
// needs of the backward.
#pragma once

#include <cstdint>
#include <type_traits>

#include "mok/error.hpp"
#include "protocol/counters.hpp"
#include "protocol/world_barrier.hpp"
#include "world/backward_state.hpp"
#include "world/pass_report.hpp"
#include "world/world.hpp"

namespace mok::world {

// The geometry a rank's counters were sized by, in the table of `Params`.
template <class Params>
const auto& backward_counter_geometry(const world::BackwardRankLayout& g) {
  if constexpr (std::is_same_v<typename Params::Pass, protocol::BackwardRecomputePass>) {
    return g.recompute_geometry;
  } else {
    return g.geometry;
  }
}

// Host-ordered: set 0 of every rank, with the world's report words.
// Device-ordered: set epoch % 2 of every rank, the world's abort flag and
// stall report being those of rank 0's set (they outlive the pass until the
// host has read them: docs/protocol.md), and the other set idle (the pass
// clears it at its end). The combine's cursor is the word after a set's
// counters.
// (State: BackwardState, deduced.)
template <class State, class Params>
void bind_backward_counters(State& s, Params& p, uint32_t epoch) {
  const bool ordered = s.core.device_ordered();
  const int set = ordered ? protocol::counter_set_of(epoch) : 0;
  uint32_t* abort = s.core.world_words;
  auto* stall = reinterpret_cast<protocol::StallReport*>(s.core.world_words + 1);
  if (ordered) {
    const world::BackwardRankLayout& g0 = s.layout.ranks[0];
    const auto rank0 = protocol::carve_counters(
        backward_counter_geometry<Params>(g0), reinterpret_cast<uint32_t*>(s.core.rank_base[0] + g0.counters[set].offset));
    abort = rank0.abort;
    stall = rank0.stall;
  }
  for (int r = 0; r < s.config.world_size; ++r) {
    uint8_t* base = s.core.rank_base[static_cast<size_t>(r)];
    if (base == nullptr) continue;
    const world::BackwardRankLayout& g = s.layout.ranks[static_cast<size_t>(r)];
    auto& v = p.ranks[r];
    auto* words = reinterpret_cast<uint32_t*>(base + g.counters[set].offset);
    v.counters = protocol::carve_counters(backward_counter_geometry<Params>(g), words, abort, stall);
    v.combine_next = words + protocol::counter_words(backward_counter_geometry<Params>(g));
    v.idle_counters = reinterpret_cast<uint32_t*>(base + g.counters[1 - set].offset);
  }
  p.epoch = ordered ? epoch : 0;
}


// Rank r's workspace pointers in the table (its base known: owned or
// mapped); in a process world, its inputs too (staged there by each pass,
// where peers read them). Counters are bound per pass (bind_counters).
// (State: BackwardState, deduced.)
template <class State, class Params>
void fill_backward_view(const State& s, Params& p, int r) {
  const world::BackwardRankLayout& g = s.layout.ranks[static_cast<size_t>(r)];
  uint8_t* base = s.core.rank_base[static_cast<size_t>(r)];
  auto& v = p.ranks[r];
  v.dout_rows = reinterpret_cast<uint16_t*>(base + g.dout_rows.offset);
  v.x_rows = reinterpret_cast<uint16_t*>(base + g.x_rows.offset);
  v.w_rows = reinterpret_cast<float*>(base + g.w_rows.offset);
  v.d13_rows = reinterpret_cast<uint16_t*>(base + g.d13_rows.offset);
  v.hw_rows = reinterpret_cast<uint16_t*>(base + g.hw_rows.offset);
  v.dw_parts = reinterpret_cast<float*>(base + g.dw_parts.offset);
  v.dx_rows = reinterpret_cast<uint16_t*>(base + g.dx_rows.offset);
  v.dx_row_of = reinterpret_cast<device::DxRowOf*>(base + g.dx_row_of.offset);
  v.shared_d13 = reinterpret_cast<uint16_t*>(base + g.shared_d13.offset);
  v.shared_h = reinterpret_cast<uint16_t*>(base + g.shared_h.offset);
  v.shared_dx = reinterpret_cast<uint16_t*>(base + g.shared_dx.offset);
  v.maps = reinterpret_cast<const CUtensorMap*>(base + g.maps.offset);
  v.barrier = reinterpret_cast<protocol::WorldBarrierWords*>(base + g.barrier.offset);
  const bool recompute = s.mode == BackwardMode::kRecompute;
  v.kept_preact = recompute ? reinterpret_cast<uint16_t*>(base + g.kept_preact.offset) : nullptr;
  v.kept_shared_preact = recompute ? reinterpret_cast<uint16_t*>(base + g.kept_shared_preact.offset) : nullptr;
  if (s.core.kind == world::WorldKind::kProcess) {
    v.x = reinterpret_cast<const uint16_t*>(base + g.staged_x.offset);
    v.dout = reinterpret_cast<const uint16_t*>(base + g.staged_dout.offset);
    v.weights = reinterpret_cast<const float*>(base + g.staged_weights.offset);
    // Every rank's combine reads this rank's padded row count here.
    v.expert_offset = reinterpret_cast<int32_t*>(base + g.staged_expert_offset.offset);
  }
}

// Device-ordered: the last pass's report, in rank 0's counter set of that
// pass (bind_counters); in a process world, kept when the peers were
// unmapped (rank 0's workspace may be a peer's).
template <class State>
world::PassReport device_ordered_backward_report(const State& s) {
  if (s.core.rank_base[0] == nullptr) {
    if (s.core.report_at_close) return *s.core.report_at_close;
    throw Error("FusedBackward::check: rank 0's workspace is not mapped in this process (call import_peers() first)");
  }
  const world::BackwardRankLayout& g0 = s.layout.ranks[0];
  auto* words =
      reinterpret_cast<uint32_t*>(s.core.rank_base[0] + g0.counters[protocol::counter_set_of(s.core.epoch)].offset);
  world::PassReport report;
  const auto read = [&](const auto& p) {
    const auto rank0 = protocol::carve_counters(backward_counter_geometry<std::remove_cvref_t<decltype(p)>>(g0), words);
    report = world::read_report_at(s.core, rank0.abort, rank0.stall);
  };
  if (s.mode == BackwardMode::kRecompute) {
    read(s.recompute_params);
  } else {
    read(s.params);
  }
  return report;
}

// What the process world's exchange needs of the backward: its layout's
// fingerprint and sizes; a mapped peer's views; its last report, kept
// before the mappings (rank 0's workspace holds it) close.
template <class State>
world::WorkspaceExchange backward_exchange(State& s) {
  world::WorkspaceExchange exchange;
  exchange.fingerprint = world::backward_fingerprint(s.config, s.options, s.kernel, s.mode);
  for (const world::BackwardRankLayout& g : s.layout.ranks) exchange.bytes.push_back(g.bytes);
  exchange.mapped = [&s](int q) { s.with_params([&](auto& p) { fill_backward_view(s, p, q); }); };
  exchange.closing = [&s] {
    if (s.core.epoch > 0) s.core.report_at_close = device_ordered_backward_report(s);
  };
  return exchange;
}

}  // namespace mok::world
