// The forward pass of one rank as a list of tasks and the counter targets that
// gate them: the single source of truth for the flow control between SM roles.
// Plain MOK_HD arithmetic over plain structs, so the megakernel and the CPU
// model of the protocol (tests/cpu/test_forward_protocol.cpp) run the same
// rule. docs/protocol.md explains every counter; keep the two in step.
//
// Vocabulary (per receiver rank, over its padded schedule of P rows):
//   m-tile     tile_m consecutive schedule rows; never straddles two experts
//              because the schedule pads every expert to a multiple of tile_m.
//   minibatch  minibatch_rows consecutive rows (a multiple of tile_m): the unit
//              in which the x ring and the h ring are recycled.
//   slot       minibatch mb lives in ring slot mb % ring_slots; its generation
//              is mb / ring_slots. Counters are monotone across generations,
//              so no counter is ever reset inside a pass.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace mok::protocol {

struct ForwardGeometry {
  int32_t padded_rows;      // P: this rank's schedule rows (multiple of tile_m)
  int32_t tile_m;           // GEMM tile height
  int32_t minibatch_rows;   // multiple of tile_m
  int32_t ring_slots;       // >= 1; ring holds ring_slots * minibatch_rows rows
  int32_t gate_up_n_tiles;  // n-tiles of one gate/up (+SwiGLU) m-tile
  int32_t down_n_tiles;     // n-tiles of one down m-tile
  int32_t shared_m_tiles;   // m-tiles of this rank's own tokens (shared expert), 0 if none
  int32_t shared_gate_up_n_tiles;
  int32_t shared_down_n_tiles;
  int32_t lookahead;        // gate/up minibatches scheduled ahead of the down tasks, >= 1

  // The lookahead in force: the h ring must hold every minibatch between a
  // gate/up and its down, so it never exceeds ring_slots.
  MOK_HD int32_t effective_lookahead() const {
    const int32_t l = lookahead < 1 ? 1 : lookahead;
    return l < ring_slots ? l : ring_slots;
  }
  MOK_HD int32_t tiles_per_minibatch() const { return minibatch_rows / tile_m; }
  MOK_HD int32_t m_tiles() const { return padded_rows / tile_m; }
  MOK_HD int32_t minibatches() const {
    return (padded_rows + minibatch_rows - 1) / minibatch_rows;
  }
  // m-tiles in minibatch mb (only the last one may be short).
  MOK_HD int32_t tiles_in_minibatch(int32_t mb) const {
    const int32_t rest = m_tiles() - mb * tiles_per_minibatch();
    return rest < tiles_per_minibatch() ? rest : tiles_per_minibatch();
  }
  MOK_HD int32_t slot_of(int32_t mb) const { return mb % ring_slots; }
  MOK_HD uint32_t generation_of(int32_t mb) const { return static_cast<uint32_t>(mb / ring_slots); }
  MOK_HD int32_t ring_tiles() const { return ring_slots * tiles_per_minibatch(); }
};

// ---- counter targets ------------------------------------------------------
// Every wait is "counter >= target". Only full minibatches ever precede a
// slot's reuse (the short one is the last), so cumulative targets are simple
// products.

// tile_filled[slot * tiles_per_minibatch + t] is stored (release) as
// generation + 1 by the one dispatch worker that copied that m-tile's rows.
MOK_HD uint32_t tile_filled_target(const ForwardGeometry& g, int32_t mb) {
  return g.generation_of(mb) + 1;
}
// ring_consumed[slot] += 1 (release) by each gate/up task once its mainloop
// stopped reading the slot. Dispatch of mb waits for the previous generation.
MOK_HD uint32_t ring_free_target(const ForwardGeometry& g, int32_t mb) {
  return g.generation_of(mb) * static_cast<uint32_t>(g.tiles_per_minibatch() * g.gate_up_n_tiles);
}
// h_ready[slot * tiles_per_minibatch + t] += 1 by each gate/up task of that
// m-tile after its h columns are stored; the down tasks of the m-tile wait for all.
MOK_HD uint32_t h_ready_target(const ForwardGeometry& g, int32_t mb) {
  return (g.generation_of(mb) + 1) * static_cast<uint32_t>(g.gate_up_n_tiles);
}
// h_consumed[slot] += 1 by each down task once it stopped reading h; gate/up
// tasks of mb wait for the previous generation before writing h.
MOK_HD uint32_t h_free_target(const ForwardGeometry& g, int32_t mb) {
  return g.generation_of(mb) * static_cast<uint32_t>(g.tiles_per_minibatch() * g.down_n_tiles);
}
// shared_h_ready[m] += 1 per shared gate/up task of m-tile m.
MOK_HD uint32_t shared_h_ready_target(const ForwardGeometry& g) {
  return static_cast<uint32_t>(g.shared_gate_up_n_tiles);
}
// shared_done += 1 per shared down task; the combine waits for all of them.
MOK_HD uint32_t shared_done_target(const ForwardGeometry& g) {
  return static_cast<uint32_t>(g.shared_m_tiles * g.shared_down_n_tiles);
}
// down_done += 1 per routed down task, after its y rows are stored (into home
// ranks' combine buffers) and made visible. A home rank waits, on every
// owner's counter, for that owner's total.
MOK_HD uint32_t down_done_target(const ForwardGeometry& g) {
  return static_cast<uint32_t>(g.m_tiles() * g.down_n_tiles);
}

// ---- GEMM task list -------------------------------------------------------
// GEMM workers take tickets 0, 1, 2, ... from one counter. The ticket order is
// a topological order of the dependencies: every task waits only on tasks
// with smaller tickets, or on dispatch work that itself waits only on tasks
// with smaller tickets. With every worker resident (persistent grid), the
// smallest unfinished ticket can always progress: no deadlock, whatever the
// ring size. Order: shared gate/up, shared down (they overlap the dispatch),
// then the routed blocks
//   GU(0) .. GU(L-1), D(0), GU(L), D(1), GU(L+1), ..., D(M-1)
// where GU(m) / D(m) are minibatch m's gate/up / down tasks (m-tile major) and
// L = effective_lookahead(). The lookahead keeps workers busy on the next
// minibatches' gate/up while a minibatch's down tasks wait for its h; it needs
// L <= ring_slots because GU(m) waits for D(m - ring_slots) (h slot reuse),
// which must come earlier in the order.

// Output columns of one gate/up (+SwiGLU) task and of one down task: the
// n-tile widths of the task list (the fused kernel's tile configurations
// assert that they agree).
inline constexpr int32_t kGateUpOutCols = 128;
inline constexpr int32_t kDownOutCols = 256;

// What fixes a rank's task list besides its schedule: the pass's options and
// the layer's dimensions (shared_width 0: no shared expert).
struct PassShape {
  int32_t tile_m, minibatch_rows, ring_slots, lookahead;
  int32_t hidden, intermediate, shared_width;
};

// The geometry of a rank's pass with `tokens` own tokens and `padded_rows`
// schedule rows (0 before the schedule exists: the shared-expert tasks do not
// need it). The one place the n-tiles are counted: the kernel's roles and the
// host's bound on the task count both call it.
MOK_HD ForwardGeometry forward_geometry(const PassShape& s, int32_t tokens, int32_t padded_rows) {
  ForwardGeometry g;
  g.padded_rows = padded_rows;
  g.tile_m = s.tile_m;
  g.minibatch_rows = s.minibatch_rows;
  g.ring_slots = s.ring_slots;
  g.lookahead = s.lookahead;
  g.gate_up_n_tiles = (s.intermediate + kGateUpOutCols - 1) / kGateUpOutCols;
  g.down_n_tiles = (s.hidden + kDownOutCols - 1) / kDownOutCols;
  g.shared_m_tiles = s.shared_width > 0 ? (tokens + s.tile_m - 1) / s.tile_m : 0;
  g.shared_gate_up_n_tiles = (s.shared_width + kGateUpOutCols - 1) / kGateUpOutCols;
  g.shared_down_n_tiles = g.down_n_tiles;
  return g;
}

enum class TaskKind : int32_t { kSharedGateUp, kSharedDown, kGateUp, kDown, kNone };

struct Task {
  TaskKind kind;
  int32_t minibatch;  // routed tasks only
  int32_t m_tile;     // index among this rank's schedule m-tiles (routed) or token m-tiles (shared)
  int32_t n_tile;
};

MOK_HD int64_t task_count(const ForwardGeometry& g) {
  const int64_t shared = static_cast<int64_t>(g.shared_m_tiles) *
                         (g.shared_gate_up_n_tiles + g.shared_down_n_tiles);
  return shared + static_cast<int64_t>(g.m_tiles()) * (g.gate_up_n_tiles + g.down_n_tiles);
}

// Task `index` (m-tile major) of minibatch mb's gate/up or down block.
// `index` < the block's task count, far below 2^31 (see decode_task).
MOK_HD Task routed_task(const ForwardGeometry& g, TaskKind kind, int32_t mb, int64_t index) {
  const int32_t n_tiles = kind == TaskKind::kGateUp ? g.gate_up_n_tiles : g.down_n_tiles;
  const int32_t i = static_cast<int32_t>(index);
  return {kind, mb, mb * g.tiles_per_minibatch() + i / n_tiles, i % n_tiles};
}

// Every quotient below is taken in 32 bits: tickets come from a 32-bit
// counter, and the host refuses a pass that could have 2^31 tasks or more
// (FusedForward's layout), so each dividend fits. (64-bit divisions are
// function calls on the GPU, on the producer's path between two tasks.)
MOK_HD Task decode_task(const ForwardGeometry& g, int64_t ticket) {
  constexpr Task kNoTask{TaskKind::kNone, -1, -1, -1};
  if (ticket < 0 || ticket > 0x7fffffff) return kNoTask;
  const int64_t shared_gu = static_cast<int64_t>(g.shared_m_tiles) * g.shared_gate_up_n_tiles;
  const int64_t shared_dn = static_cast<int64_t>(g.shared_m_tiles) * g.shared_down_n_tiles;
  if (ticket < shared_gu) {
    const int32_t i = static_cast<int32_t>(ticket);
    return {TaskKind::kSharedGateUp, -1, i / g.shared_gate_up_n_tiles, i % g.shared_gate_up_n_tiles};
  }
  ticket -= shared_gu;
  if (ticket < shared_dn) {
    const int32_t i = static_cast<int32_t>(ticket);
    return {TaskKind::kSharedDown, -1, i / g.shared_down_n_tiles, i % g.shared_down_n_tiles};
  }
  ticket -= shared_dn;

  const int32_t M = g.minibatches();
  const int32_t L = g.effective_lookahead();
  auto gu_size = [&](int32_t mb) -> int64_t { return static_cast<int64_t>(g.tiles_in_minibatch(mb)) * g.gate_up_n_tiles; };
  auto down_size = [&](int32_t mb) -> int64_t { return static_cast<int64_t>(g.tiles_in_minibatch(mb)) * g.down_n_tiles; };
  // 1. GU(0) .. GU(L-1).
  for (int32_t mb = 0; mb < L && mb < M; ++mb) {
    if (ticket < gu_size(mb)) return routed_task(g, TaskKind::kGateUp, mb, ticket);
    ticket -= gu_size(mb);
  }
  // 2. Pairs D(j), GU(j + L) of full minibatches (only the last one is short),
  //    in closed form.
  const int64_t full_gu = static_cast<int64_t>(g.tiles_per_minibatch()) * g.gate_up_n_tiles;
  const int64_t full_down = static_cast<int64_t>(g.tiles_per_minibatch()) * g.down_n_tiles;
  const int32_t full_pairs = M - 1 - L > 0 ? M - 1 - L : 0;
  if (ticket < full_pairs * (full_gu + full_down)) {
    const int32_t pair = static_cast<int32_t>(full_gu + full_down);
    const int32_t j = static_cast<int32_t>(ticket) / pair;
    const int64_t in_pair = static_cast<int32_t>(ticket) % pair;
    return in_pair < full_down ? routed_task(g, TaskKind::kDown, j, in_pair)
                               : routed_task(g, TaskKind::kGateUp, j + L, in_pair - full_down);
  }
  ticket -= full_pairs * (full_gu + full_down);
  // 3. The remaining blocks (at most L + 1 of them), one by one.
  for (int32_t j = full_pairs; j < M; ++j) {
    if (ticket < down_size(j)) return routed_task(g, TaskKind::kDown, j, ticket);
    ticket -= down_size(j);
    if (j + L < M) {
      if (ticket < gu_size(j + L)) return routed_task(g, TaskKind::kGateUp, j + L, ticket);
      ticket -= gu_size(j + L);
    }
  }
  return kNoTask;
}

// Where m-tile `m_tile` of the schedule sits in the ring (x and h rings share
// the slot geometry): index of its tile_filled / h_ready counter, and its first ring row.
MOK_HD int32_t ring_tile_index(const ForwardGeometry& g, int32_t m_tile) {
  const int32_t mb = m_tile / g.tiles_per_minibatch();
  return g.slot_of(mb) * g.tiles_per_minibatch() + (m_tile - mb * g.tiles_per_minibatch());
}
MOK_HD int32_t ring_row_of_tile(const ForwardGeometry& g, int32_t m_tile) {
  return ring_tile_index(g, m_tile) * g.tile_m;
}

}  // namespace mok::protocol
