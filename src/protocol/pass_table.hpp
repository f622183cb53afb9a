// A pass of the megakernel as a table: the vocabulary every pass table uses
// (src/protocol/pass_forward.hpp is one), and the rules that turn a table into
// the pass's geometry, its GEMM ticket order and its counter targets. The
// GEMM roles, the counters' layout and the CPU model of the protocol
// (tests/cpu/test_pass_protocol.cpp) all walk a table through these
// functions; a new pass is a new table plus its epilogues.
//
// A Pass is a struct with
//   kNumKinds, kKinds[kNumKinds]       its GEMM task kinds (TaskKindSpec);
//   kNumCounters, kCounters[...]       the counters its roles wait on (CounterSpec);
//   kPrologue[], kPipeline[]           its ticket order (below; optionally kTokenFinale[] and
//                                      kFinale[] after the pipeline);
//   kDispatch, kCombine                the waits and signals of its non-GEMM roles (RoleSpec).
//
// Vocabulary (per receiver rank, over its padded schedule of P rows):
//   m-tile     tile_m consecutive schedule rows; never straddles two experts
//              because the schedule pads every expert to tile_m.
//   token tile token_tile_m consecutive own tokens: the m-tile of the
//              own-token kinds (Rows::kTokens), whose Span::kTokenTile
//              counters count token tiles. It is tile_m unless the table's
//              own-token kinds run taller tiles than its schedule kinds (the
//              FP8 forward: 128-row bf16 shared-expert tiles, 64-row FP8
//              routed tiles); the schedule never sees it.
//   minibatch  minibatch_rows consecutive schedule rows (a multiple of tile_m):
//              the unit in which the rings are recycled.
//   slot       minibatch mb lives in ring slot mb % ring_slots; its generation
//              is mb / ring_slots. Counters are monotone across generations,
//              so no counter is ever reset inside a pass.
//
// Every wait is "counter >= target". A counter moves in one of two ways: each
// signal adds 1, or (a counter written by one worker per index) the signal
// stores generation + 1. Either way, one index gains signals_per_generation()
// per generation, and a wait for generation gen's data ("ready") targets
// (gen + 1) x that, a wait for the previous generation's readers ("free") gen
// x that. Only full minibatches precede a slot's reuse (the short one is the
// last), so those products are exact: pass_table_is_consistent() below
// enforces what that needs at compile time, and the CPU test
// (PassTable.TicketOrderMeetsEveryWaitWithSmallerTickets, a template over the
// pass) counts the signals behind every target of a table.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/gemm_tile_shape.hpp"
#include "common/host_device.hpp"

namespace mok::protocol {

// Every tensor a task reads or writes. The first kNumMappedTensors are read by
// TMA through a tensor map (the map's index is the value); the rest are only
// written by a task and read with plain loads.
// (The FP8 forward's rings hold e4m3 values with one ue8m0 scale per 128
// columns of a row, and its routed weights are e4m3 with their block scales:
// the same tensors, read through FP8 maps; pass_forward_fp8.hpp.)
enum class Tensor : int32_t {
  kRingX = 0,      // bf16 [ring rows, H]: pulled x rows
  kW13 = 1,        // bf16 [El, 2I, H]: gate rows, then up rows
  kRingH = 2,      // bf16 [ring rows, I]: SwiGLU activations of the ring's rows
  kW2 = 3,         // bf16 [El, H, I]
  kX = 4,          // bf16 [T, H]: the rank's own tokens
  kSharedW13 = 5,  // bf16 [2S, H]
  kSharedH = 6,    // bf16 [T, S]
  kSharedW2 = 7,   // bf16 [H, S]
  kSharedOut = 8,  // bf16 [T, H]: the shared expert's output, read by the combine
  kHomeCombine = 9,  // bf16 [T * k, H] on the token's home rank: one row per (token, slot)
  // The backward's (docs/backward-design.md; its tensor maps will have their
  // own indices): dout and gathered rows of the whole schedule.
  kDout = 10,             // bf16 [T, H]: dL/dout of the rank's own tokens
  kDoutRows = 11,         // bf16 [P, H]: dout of every schedule row
  kXRows = 12,            // bf16 [P, H]: x of every schedule row
  kD13Rows = 13,          // bf16 [P, 2I]: [da | db] of every schedule row
  kHwRows = 17,           // bf16 [P, I]: w * h of every schedule row
  kNoTensor = 99,         // none (an unused output or role field)
  kSharedD13 = 14,        // bf16 [T, 2S]
  kSharedDx = 15,         // bf16 [T, H]: the shared expert's part of dx
  kWeightGrad13 = 16,     // fp32 [El, 2I, H]: dW13 of the rank's experts
  kWeightGrad2 = 18,      // fp32 [El, H, I]: dW2
  kPreactRows = 20,       // bf16 [P, 2I]: [gate | up] of every schedule row (saved by the forward, or recomputed)
  kSharedPreact = 21,     // bf16 [T, 2S]: the shared expert's [gate | up] (saved, or recomputed)
  kSharedWeightGrad13 = 22,  // fp32 [2S, H]: the shared expert's dW13
  kSharedWeightGrad2 = 23,   // fp32 [H, S]: its dW2
  // bf16 [P, H]: dx_j of every schedule row on its owner, stored by TMA
  // boxes; the home rank's combine reads each (token, slot)'s row there.
  kDxRows = 24,
};
inline constexpr int32_t kNumMappedTensors = 8;
MOK_HD constexpr bool read_through_map(Tensor t) {
  return static_cast<int32_t>(t) >= 0 && static_cast<int32_t>(t) < kNumMappedTensors;
}

// A layer dimension, resolved against PassShape at run time (kNone: 0, for a
// field a kind does not use).
enum class Dim : int32_t { kHidden, kIntermediate, kSharedWidth, kTwoIntermediate, kTwoSharedWidth, kNone };

// Whose rows a task's m-tile holds.
enum class Rows : int32_t {
  kSchedule,  // schedule rows, staged in the ring slot of their minibatch
  kTokens,    // the rank's own tokens, in token order (m-tiles: token tiles)
  kExpert,    // one local expert's output tile, reducing over all its schedule
              // rows (a weight gradient): K is that expert's padded rows
  kTokenReduce,  // one output tile of a matrix reduced over the rank's own
                 // tokens (the shared expert's weight gradient): K is the tokens
};

// What one index of a counter array stands for.
enum class Span : int32_t {
  kRingTile,   // one m-tile position of the ring (slot x tiles per minibatch)
  kRingSlot,   // one ring slot
  kTokenTile,  // one m-tile of the rank's own tokens
  kWhole,      // the whole pass (one word)
  kExpert,     // one local expert
};

// Which generation of a counter's index a wait needs.
enum class Await : int32_t {
  kReady,  // this generation's signals are all in (the data is there)
  kFree,   // the previous generation's signals are all in (its readers are done)
};

inline constexpr int32_t kMaxWaits = 2;
inline constexpr int32_t kMaxSignals = 2;
inline constexpr int32_t kNoCounter = -1;
inline constexpr int32_t kNoTaskKind = -1;

// (Structs with defaults, not plain ints: entries a table leaves out of a
// braced list then mean "none", where an int would mean counter 0.)
struct CounterWait {
  int32_t counter = kNoCounter;  // index into the pass's kCounters
  Await await = Await::kReady;
};
struct CounterSignal {
  int32_t counter = kNoCounter;
};

struct CounterSpec {
  uint32_t report_id;  // CounterId named in stall reports (counters.hpp)
  Span span;
  bool stores_generation;  // signalled by a store of generation + 1 (one writer per index), not by adds
};

// One GEMM task kind: out[rows of one m-tile, n-tile columns] = epilogue(A . B^T).
struct TaskKindSpec {
  GemmTileShape tile;  // its tile; the n-tile width is tile.out_cols()
  Tensor a;            // [rows, K], K-major
  Tensor b;            // [columns, K] per expert (routed) or one matrix, K-major
  Dim k;               // reduction length
  Dim n;               // output width (columns of `out`)
  Rows rows;
  Tensor out;          // where each output row goes
  CounterWait waits[kMaxWaits];        // inputs, in the order they are awaited
  CounterSignal signals[kMaxSignals];  // raised once the task's outputs are visible
  Dim m = Dim::kNone;                  // Rows::kExpert: the output's rows (a weight's rows)
  Tensor also_out = Tensor::kNoTensor; // a second output the epilogue writes, row for row with `out`
  Tensor also_in = Tensor::kNoTensor;  // an input the epilogue reads, row for row with A (the SwiGLU
                                       // backward's pre-activations)
};

// The waits and signals of a role that is not a GEMM task (dispatch of one
// m-tile, the combine of a rank).
struct RoleSpec {
  CounterWait waits[kMaxWaits];
  CounterSignal signals[kMaxSignals];
  // Its dataflow (the CPU model checks it): what it writes (dispatch: the
  // pulled rows) and what it reads once its waits are met (combine).
  Tensor writes[2] = {Tensor::kNoTensor, Tensor::kNoTensor};
  Tensor reads[2] = {Tensor::kNoTensor, Tensor::kNoTensor};
};

// A spec as a type (Spec::value), so that code generic over kinds and roles
// reads it as a constant expression: device code may not take the address
// of a host constexpr table.
template <class Pass, int32_t kKind>
struct KindSpec {
  static constexpr TaskKindSpec value = Pass::kKinds[kKind];
};

// One block stream of the pass's pipeline: at step s it emits the tasks of
// `kind` for minibatch s - lag, lag = 0 or the lookahead; m-tile major, or
// with n_major n-tile major (the tasks running at once then share fewer
// B panels: for a kind whose B panels of one expert exceed L2, each is read
// once per minibatch instead of once per wave of tasks).
struct PipelineEntry {
  int32_t kind;
  bool lags;
  bool n_major = false;
};

// What fixes a rank's task list besides its schedule: the pass's options and
// the layer's dimensions (shared_width 0: no shared expert).
struct PassShape {
  int32_t tile_m, minibatch_rows, ring_slots, lookahead;
  int32_t hidden, intermediate, shared_width;
  int32_t local_experts = 0;  // passes with per-expert kinds or counters only
  int32_t token_tile_m = 0;   // the token tile; 0: tile_m (shape_token_tile_m<Pass>() says which)
  // Bit k: kind k's pipeline blocks run n-tile major even where the table's
  // entry does not say so (a choice of the host for the layer's shape:
  // world::forward_n_major_kinds). The order of a block's tasks changes no
  // wait and no bit, only which B panels the tasks running at once share.
  uint32_t n_major_kinds = 0;
};

// The token tile a shape gives its own-token kinds.
MOK_HD constexpr int32_t token_tile_of(const PassShape& s) { return s.token_tile_m > 0 ? s.token_tile_m : s.tile_m; }

MOK_HD constexpr int32_t dim_of(const PassShape& s, Dim d) {
  switch (d) {
    case Dim::kHidden: return s.hidden;
    case Dim::kIntermediate: return s.intermediate;
    case Dim::kSharedWidth: return s.shared_width;
    case Dim::kTwoIntermediate: return 2 * s.intermediate;
    case Dim::kTwoSharedWidth: return 2 * s.shared_width;
    case Dim::kNone: return 0;
  }
  return 0;
}

// ---- visiting a kind known only at run time ---------------------------------
// The index an f(std::integral_constant) callback was called with, as a
// constant expression (decltype of a captured parameter may be a reference).
template <class T>
inline constexpr int32_t index_of = std::remove_cvref_t<T>::value;

// Calls f(std::integral_constant<int32_t, kind>) so that f can read the kind's
// spec as a constant expression (the roles pick tile configs and epilogues
// from it at compile time). A switch, once the compiler has folded it.
template <int32_t kKind, int32_t kCount, class F>
MOK_HD constexpr void visit_kind_from(int32_t kind, F&& f) {
  if constexpr (kKind < kCount) {
    if (kind == kKind) {
      f(std::integral_constant<int32_t, kKind>{});
    } else {
      visit_kind_from<kKind + 1, kCount>(kind, static_cast<F&&>(f));
    }
  }
}
template <class Pass, class F>
MOK_HD constexpr void visit_kind(int32_t kind, F&& f) {
  visit_kind_from<0, Pass::kNumKinds>(kind, static_cast<F&&>(f));
}
// Calls f(std::integral_constant<int32_t, i>) for i = 0 .. kCount - 1.
template <int32_t kCount, class F>
MOK_HD constexpr void for_each_index(F&& f) {
  [&]<int32_t... kI>(std::integer_sequence<int32_t, kI...>) {
    (f(std::integral_constant<int32_t, kI>{}), ...);
  }(std::make_integer_sequence<int32_t, kCount>{});
}

// ---- optional parts of a table -----------------------------------------------
// kFinale[]: per-expert kinds handed out after the pipeline, expert by expert.
template <class Pass>
constexpr bool has_finale() {
  return requires { Pass::kFinale; };
}
template <class Pass>
constexpr int32_t finale_size() {
  if constexpr (has_finale<Pass>()) {
    return static_cast<int32_t>(sizeof(Pass::kFinale) / sizeof(int32_t));
  } else {
    return 0;
  }
}
template <class Pass>
constexpr int32_t finale_kind(int32_t i) {
  if constexpr (has_finale<Pass>()) {
    return Pass::kFinale[i];
  } else {
    (void)i;
    return kNoTaskKind;
  }
}
// kTokenFinale[]: kinds reduced over the rank's own tokens, handed out after
// the pipeline and before kFinale's per-expert blocks, every task of each.
template <class Pass>
constexpr bool has_token_finale() {
  return requires { Pass::kTokenFinale; };
}
template <class Pass>
constexpr int32_t token_finale_size() {
  if constexpr (has_token_finale<Pass>()) {
    return static_cast<int32_t>(sizeof(Pass::kTokenFinale) / sizeof(int32_t));
  } else {
    return 0;
  }
}
template <class Pass>
constexpr int32_t token_finale_kind(int32_t i) {
  if constexpr (has_token_finale<Pass>()) {
    return Pass::kTokenFinale[i];
  } else {
    (void)i;
    return kNoTaskKind;
  }
}
// A kind whose tasks are tiles of a weight gradient: per local expert, or
// over the rank's own tokens. Its m-tiles count the output's row tiles and
// its K is rows known only with the schedule (or the tokens).
MOK_HD constexpr bool reduces_rows(Rows rows) { return rows == Rows::kExpert || rows == Rows::kTokenReduce; }

// Whether a pass has per-expert kinds or counters, or token-reduced kinds
// (the forward has none, and its geometry carries nothing for them).
template <class Pass>
constexpr bool has_expert_work() {
  for (int32_t k = 0; k < Pass::kNumKinds; ++k) {
    if (reduces_rows(Pass::kKinds[k].rows)) return true;
  }
  for (int32_t c = 0; c < Pass::kNumCounters; ++c) {
    if (Pass::kCounters[c].span == Span::kExpert) return true;
  }
  return false;
}

// ---- tile heights ---------------------------------------------------------------
// A pass's m-tiles have two heights, each its kinds' tiles' block_m: the
// m-tile (tile_m), of its schedule kinds, and the token tile, of its
// own-token kinds. All kinds of one sort of rows share theirs (the geometry
// counts one set of m-tiles per sort; pass_table_is_consistent checks it).
// The height of the kinds of `rows`: 0 when the pass has none, -1 when they
// disagree. (A per-expert or token-reduced kind's m-tiles are its output's
// row tiles, counted by its own tile: no constraint.)
template <class Pass>
constexpr int32_t kinds_block_m(Rows rows) {
  int32_t height = 0;
  for (int32_t k = 0; k < Pass::kNumKinds; ++k) {
    if (Pass::kKinds[k].rows != rows) continue;
    if (height != 0 && Pass::kKinds[k].tile.block_m != height) return -1;
    height = Pass::kKinds[k].tile.block_m;
  }
  return height;
}

// What PassShape::token_tile_m is for a pass: its own-token kinds' height
// where that differs from its schedule kinds' (the FP8 forward's first
// kernel had 128 against 64), else 0, "the m-tile" -- so a table whose kinds
// share one height (every pass today) keeps its token geometry on the
// run-time tile_m.
template <class Pass>
MOK_HD constexpr int32_t shape_token_tile_m() {
  constexpr int32_t kToken = kinds_block_m<Pass>(Rows::kTokens);
  constexpr int32_t kSchedule = kinds_block_m<Pass>(Rows::kSchedule);
  return kToken > 0 && kSchedule > 0 && kToken != kSchedule ? kToken : 0;
}

// Whether a shape's heights are its table's tiles' (what the kernel runs):
// the host must refuse a shape for which this is false. (The CPU models give
// their tables small heights of their own and do not ask.)
template <class Pass>
constexpr bool shape_fits_tiles(const PassShape& s) {
  constexpr int32_t kToken = kinds_block_m<Pass>(Rows::kTokens);
  constexpr int32_t kSchedule = kinds_block_m<Pass>(Rows::kSchedule);
  return (kSchedule == 0 || s.tile_m == kSchedule) && (kToken == 0 || token_tile_of(s) == kToken);
}

// A pass whose buffers must never wrap (it awaits no slot's readers, e.g. the
// backward, whose weight gradients read every row of an expert at the end).
template <class Pass>
constexpr bool needs_whole_schedule() {
  if constexpr (requires { Pass::kWholeSchedule; }) {
    return Pass::kWholeSchedule;
  } else {
    return false;
  }
}

// A pass that runs over a schedule an earlier pass built (the backward, over
// its forward's): no schedule warps, and the schedule is complete at launch.
template <class Pass>
constexpr bool schedule_given() {
  if constexpr (requires { Pass::kScheduleGiven; }) {
    return Pass::kScheduleGiven;
  } else {
    return false;
  }
}

// The tensor map a kind's operand (0: A, 1: B) is read through. The forward
// reads each mapped tensor one way: its map is the tensor's index. A pass
// that reads one tensor K-major in one kind and MN-major in another (the
// backward's d13 rows) sets kMapPerOperand: a map per (kind, operand).
template <class Pass>
MOK_HD constexpr int32_t map_index(int32_t kind, int32_t operand) {
  if constexpr (requires { Pass::kMapPerOperand; }) {
    return 2 * kind + operand;
  } else {
    return static_cast<int32_t>(operand == 0 ? Pass::kKinds[kind].a : Pass::kKinds[kind].b);
  }
}

// The TMA tensor maps per rank of a pass with a map per operand and weight
// gradients (the backward's): one per operand of each kind (map_index), then
// the outputs stored by TMA boxes: the weight gradients (dW13, dW2, the
// shared expert's dW13, dW2; unused, and left zero, for fp32 output) and
// the dx rows.
inline constexpr int32_t kBoxStoredOutputs = 5;
template <class Pass>
MOK_HD constexpr int32_t num_backward_maps() {
  return 2 * Pass::kNumKinds + kBoxStoredOutputs;
}
template <class Pass>
MOK_HD constexpr int32_t output_map(Tensor out) {
  return 2 * Pass::kNumKinds + (out == Tensor::kWeightGrad13         ? 0
                                : out == Tensor::kWeightGrad2        ? 1
                                : out == Tensor::kSharedWeightGrad13 ? 2
                                : out == Tensor::kSharedWeightGrad2  ? 3
                                                                     : 4);
}

// An output whose TMA stores may still be in flight when its task is handed
// off, because a reader in the same pass needs them complete (the dx rows,
// which the combine reads): its issuing threads wait for them before the
// next task's epilogue, and the signaler publishes such a task together with
// the next one (docs/protocol.md, "Late signals"). The kinds that wait for
// its signals must not be in the GEMM CTAs' task lists (the combine alone
// waits for dx_done).
MOK_HD constexpr bool signals_late(Tensor out) { return out == Tensor::kDxRows; }

// Whether some kind of the pass reads tensor t through TMA (the async proxy):
// a task storing t with generic stores must then fence before it signals.
template <class Pass>
MOK_HD constexpr bool read_by_tma(Tensor t) {
  for (int32_t k = 0; k < Pass::kNumKinds; ++k) {
    if (Pass::kKinds[k].a == t || Pass::kKinds[k].b == t) return true;
  }
  return false;
}

// ---- what a table must satisfy (checked at compile time) ----------------------
// Every kind has a tile, and the kinds of schedule rows share one height, as
// do the kinds of own tokens (kinds_block_m); every kind is handed out
// exactly once: by the prologue (own-token kinds, which need no schedule),
// the pipeline (schedule-row kinds) or the finale (token-reduced kinds, then
// per-expert kinds); a kind without a minibatch moves no ring counter, and a
// kind of own tokens no per-expert one; a ring-slot counter is only awaited
// for the previous generation (the last minibatch may be short, so "this
// generation's slot is complete" has no fixed target); every counter named
// exists.
template <class Pass>
constexpr bool pass_table_is_consistent() {
  constexpr int32_t kPrologueKinds = static_cast<int32_t>(sizeof(Pass::kPrologue) / sizeof(int32_t));
  constexpr int32_t kPipelineKinds = static_cast<int32_t>(sizeof(Pass::kPipeline) / sizeof(PipelineEntry));
  if (kinds_block_m<Pass>(Rows::kSchedule) < 0 || kinds_block_m<Pass>(Rows::kTokens) < 0) return false;
  for (int32_t k = 0; k < Pass::kNumKinds; ++k) {
    const TaskKindSpec& spec = Pass::kKinds[k];
    if (spec.tile.block_m <= 0 || spec.tile.block_n <= 0) return false;
    int32_t seen = 0;
    for (int32_t p = 0; p < kPrologueKinds; ++p) {
      if (Pass::kPrologue[p] != k) continue;
      ++seen;
      if (spec.rows != Rows::kTokens) return false;
    }
    for (int32_t p = 0; p < kPipelineKinds; ++p) {
      if (Pass::kPipeline[p].kind != k) continue;
      ++seen;
      if (spec.rows != Rows::kSchedule) return false;
    }
    for (int32_t p = 0; p < finale_size<Pass>(); ++p) {
      if (finale_kind<Pass>(p) != k) continue;
      ++seen;
      if (spec.rows != Rows::kExpert) return false;
    }
    for (int32_t p = 0; p < token_finale_size<Pass>(); ++p) {
      if (token_finale_kind<Pass>(p) != k) continue;
      ++seen;
      if (spec.rows != Rows::kTokenReduce) return false;
    }
    if (seen != 1) return false;
    auto allowed = [&](int32_t counter) {
      if (counter < 0 || counter >= Pass::kNumCounters) return false;
      const Span span = Pass::kCounters[counter].span;
      const bool ring = span == Span::kRingTile || span == Span::kRingSlot;
      if (spec.rows != Rows::kSchedule && ring) return false;
      if ((spec.rows == Rows::kTokens || spec.rows == Rows::kTokenReduce) && span == Span::kExpert) return false;
      return true;
    };
    for (const CounterWait& w : spec.waits) {
      if (w.counter == kNoCounter) continue;
      if (!allowed(w.counter)) return false;
      if (Pass::kCounters[w.counter].span == Span::kRingSlot && w.await == Await::kReady) return false;
    }
    for (const CounterSignal& sig : spec.signals) {
      if (sig.counter != kNoCounter && !allowed(sig.counter)) return false;
    }
  }
  // A kind whose signals come late (signals_late) signals no counter that a
  // kind waits for: the signaler holds them until the CTA's next task is
  // done, which must not depend on them.
  for (int32_t k = 0; k < Pass::kNumKinds; ++k) {
    if (!signals_late(Pass::kKinds[k].out)) continue;
    for (const CounterSignal& sig : Pass::kKinds[k].signals) {
      for (int32_t j = 0; sig.counter != kNoCounter && j < Pass::kNumKinds; ++j) {
        for (const CounterWait& w : Pass::kKinds[j].waits) {
          if (w.counter == sig.counter) return false;
        }
      }
    }
  }
  // The roles: counters that exist; the combine, which names no m-tile or
  // expert (it polls each owner's totals), waits on whole-pass counters only.
  for (const CounterWait& w : Pass::Dispatch::value.waits) {
    if (w.counter != kNoCounter && (w.counter < 0 || w.counter >= Pass::kNumCounters)) return false;
  }
  for (const CounterSignal& sig : Pass::Dispatch::value.signals) {
    if (sig.counter != kNoCounter && (sig.counter < 0 || sig.counter >= Pass::kNumCounters)) return false;
  }
  for (const CounterWait& w : Pass::Combine::value.waits) {
    if (w.counter == kNoCounter) continue;
    if (w.counter < 0 || w.counter >= Pass::kNumCounters || Pass::kCounters[w.counter].span != Span::kWhole) return false;
  }
  return true;
}

// ---- geometry -----------------------------------------------------------------
// What a pass with per-expert work needs besides (nothing, for the forward:
// the empty base adds no bytes).
template <class Pass, bool = has_expert_work<Pass>()>
struct ExpertGeometry {};
template <class Pass>
struct ExpertGeometry<Pass, true> {
  int32_t local_experts;                    // El
  int32_t expert_m_tiles[Pass::kNumKinds];  // Rows::kExpert kinds: output row tiles per expert;
                                            // Rows::kTokenReduce kinds: of their one matrix
};

// A per-expert kind's output row tiles per expert, and over all experts (0
// for a pass without per-expert work, whose geometry has no such fields).
template <class Pass>
MOK_HD int32_t expert_m_tiles_of(const ExpertGeometry<Pass>& g, int32_t kind) {
  if constexpr (has_expert_work<Pass>()) {
    return g.expert_m_tiles[kind];
  } else {
    (void)g;
    (void)kind;
    return 0;
  }
}
template <class Pass>
MOK_HD int32_t all_experts_m_tiles_of(const ExpertGeometry<Pass>& g, int32_t kind) {
  if constexpr (has_expert_work<Pass>()) {
    return g.local_experts * g.expert_m_tiles[kind];
  } else {
    (void)g;
    (void)kind;
    return 0;
  }
}

template <class Pass>
struct PassGeometry : ExpertGeometry<Pass> {
  int32_t padded_rows;      // P: this rank's schedule rows (multiple of tile_m)
  int32_t tile_m;           // the m-tile: the schedule kinds' GEMM tile height
  int32_t minibatch_rows;   // multiple of tile_m
  int32_t ring_slots;       // >= 1; a ring holds ring_slots * minibatch_rows rows
  int32_t lookahead;        // minibatches a lagging pipeline entry trails by, >= 1
  int32_t token_tile_m;     // rows of a token tile (own-token kinds' m-tile)
  int32_t token_m_tiles;    // token tiles of the rank's own tokens
  int32_t n_tiles[Pass::kNumKinds];  // n-tiles of one m-tile, per kind (0: the kind has no tasks)
  uint32_t n_major_kinds;            // PassShape::n_major_kinds

  // The lookahead in force: a lagging block reads what the leading block of
  // the same minibatch wrote into the ring, so it never trails by more than
  // the ring holds.
  MOK_HD int32_t effective_lookahead() const {
    const int32_t l = lookahead < 1 ? 1 : lookahead;
    return l < ring_slots ? l : ring_slots;
  }
  MOK_HD int32_t tiles_per_minibatch() const { return minibatch_rows / tile_m; }
  MOK_HD int32_t m_tiles() const { return padded_rows / tile_m; }  // schedule m-tiles
  MOK_HD int32_t minibatches() const {
    // 64-bit sum: padded_rows may come close to 2^31.
    return static_cast<int32_t>((static_cast<int64_t>(padded_rows) + minibatch_rows - 1) / minibatch_rows);
  }
  // m-tiles in minibatch mb (only the last one may be short).
  MOK_HD int32_t tiles_in_minibatch(int32_t mb) const {
    const int32_t rest = m_tiles() - mb * tiles_per_minibatch();
    return rest < tiles_per_minibatch() ? rest : tiles_per_minibatch();
  }
  MOK_HD int32_t slot_of(int32_t mb) const { return mb % ring_slots; }
  MOK_HD uint32_t generation_of(int32_t mb) const { return static_cast<uint32_t>(mb / ring_slots); }
  MOK_HD int32_t ring_tiles() const { return ring_slots * tiles_per_minibatch(); }
  // m-tiles of a kind: schedule m-tiles or token tiles, (per-expert kinds) every
  // expert's output row tiles, expert-major, or (token-reduced kinds) its
  // matrix's row tiles.
  MOK_HD int32_t kind_m_tiles(int32_t kind) const {
    int32_t m = 0;
    visit_kind<Pass>(kind, [&](auto K) {
      constexpr Rows rows = Pass::kKinds[index_of<decltype(K)>].rows;
      if constexpr (rows == Rows::kSchedule) {
        m = m_tiles();
      } else if constexpr (rows == Rows::kTokens) {
        m = token_m_tiles;
      } else if constexpr (rows == Rows::kTokenReduce) {
        m = expert_m_tiles_of<Pass>(*this, index_of<decltype(K)>);
      } else {
        m = all_experts_m_tiles_of<Pass>(*this, index_of<decltype(K)>);
      }
    });
    return m;
  }
};

// The geometry of a rank's pass with `tokens` own tokens and `padded_rows`
// schedule rows (0 before the schedule exists: token-row tasks do not need
// it). The one place n-tiles are counted: the kernel's roles, the host's
// bound on the task count and the counter layout all call it. A kind whose
// K or output width is 0 (the shared expert of a layer without one) has no
// tasks.
template <class Pass>
MOK_HD PassGeometry<Pass> pass_geometry(const PassShape& s, int32_t tokens, int32_t padded_rows) {
  PassGeometry<Pass> g{};
  g.padded_rows = padded_rows;
  g.tile_m = s.tile_m;
  g.minibatch_rows = s.minibatch_rows;
  g.ring_slots = s.ring_slots;
  g.lookahead = s.lookahead;
  g.token_tile_m = token_tile_of(s);
  g.token_m_tiles = (tokens + g.token_tile_m - 1) / g.token_tile_m;
  g.n_major_kinds = s.n_major_kinds;
  for_each_index<Pass::kNumKinds>([&](auto K) {
    constexpr TaskKindSpec spec = Pass::kKinds[K];
    const int32_t n = dim_of(s, spec.n);
    // A weight gradient's K is its expert's rows (or the tokens), known only
    // with the schedule; an empty one still has its tiles (of zeros).
    const int32_t k = reduces_rows(spec.rows) ? 1 : dim_of(s, spec.k);
    g.n_tiles[K] = n > 0 && k > 0 ? (n + spec.tile.out_cols() - 1) / spec.tile.out_cols() : 0;
    if constexpr (has_expert_work<Pass>()) {
      const int32_t m = dim_of(s, spec.m);
      g.expert_m_tiles[K] = reduces_rows(spec.rows) ? (m + spec.tile.block_m - 1) / spec.tile.block_m : 0;
    }
  });
  if constexpr (has_expert_work<Pass>()) g.local_experts = s.local_experts;
  return g;
}

// ---- the ticket order ---------------------------------------------------------
// GEMM workers take tickets 0, 1, 2, ... from one counter. The order is the
// prologue's kinds (every task of each, m-tile major), then the pipeline:
// step s = 0, 1, ... emits, for each entry in order, the tasks of its kind for
// minibatch s - lag (m-tile major, or n-tile major for an n_major entry or a
// kind in the shape's n_major_kinds) when
// that minibatch exists; then the finale: the token-reduced kinds (every
// task of each, m-tile major), then the per-expert blocks. It must be a
// topological order of the table's waits: every task waits only on tasks
// with smaller tickets, or on dispatch work that itself waits only on such
// tasks. With every worker resident (persistent grid), the smallest
// unfinished ticket can then always progress: no deadlock, whatever the ring
// size (docs/protocol.md; the CPU model checks it for the table).

inline constexpr int32_t kNoTask = -1;

struct Task {
  int32_t kind;       // the pass's kind, or kNoTask
  int32_t minibatch;  // schedule-row tasks only (-1 otherwise)
  int32_t m_tile;     // index among the schedule's m-tiles, or among the token tiles
  int32_t n_tile;
};

template <class Pass>
MOK_HD int64_t task_count(const PassGeometry<Pass>& g) {
  int64_t count = 0;
  for_each_index<Pass::kNumKinds>([&](auto K) {
    count += static_cast<int64_t>(g.kind_m_tiles(K)) * g.n_tiles[K];
  });
  return count;
}

// Tasks of the prologue (own-token kinds, which need no schedule): the
// tickets a GEMM worker can take before the schedule exists.
template <class Pass>
MOK_HD int64_t prologue_task_count(const PassGeometry<Pass>& g) {
  int64_t count = 0;
  for_each_index<static_cast<int32_t>(sizeof(Pass::kPrologue) / sizeof(int32_t))>([&](auto P) {
    constexpr int32_t kind = Pass::kPrologue[P];
    count += static_cast<int64_t>(g.kind_m_tiles(kind)) * g.n_tiles[kind];
  });
  return count;
}

// Whether a pass that needs its whole schedule resident (needs_whole_schedule)
// got enough slots for it; every other pass recycles its ring and always fits.
// The host must refuse a pass for which this is false.
template <class Pass>
MOK_HD bool buffers_hold_schedule(const PassGeometry<Pass>& g) {
  if constexpr (needs_whole_schedule<Pass>()) {
    return static_cast<int64_t>(g.ring_slots) * g.tiles_per_minibatch() >= g.m_tiles();
  } else {
    (void)g;
    return true;
  }
}

// The most tasks a pass of this shape can have, with `tokens` own tokens and
// a schedule of up to `max_schedule_rows` rows (the host's bound on the
// ticket space; 64-bit: an absurd shape can exceed int32).
template <class Pass>
MOK_HD int64_t max_task_count(const PassShape& s, int32_t tokens, int64_t max_schedule_rows) {
  const PassGeometry<Pass> g = pass_geometry<Pass>(s, tokens, 0);
  const int64_t schedule_m_tiles = (max_schedule_rows + s.tile_m - 1) / s.tile_m;
  int64_t count = 0;
  for_each_index<Pass::kNumKinds>([&](auto K) {
    const int64_t m_tiles = Pass::kKinds[K].rows == Rows::kSchedule ? schedule_m_tiles : g.kind_m_tiles(K);
    count += m_tiles * g.n_tiles[K];
  });
  return count;
}

namespace detail {
// Tasks of one pipeline entry's block for minibatch mb (in its order), or
// false with `ticket` reduced by the block's size.
template <class Pass>
MOK_HD bool pipeline_block(const PassGeometry<Pass>& g, PipelineEntry entry, int32_t mb, int32_t& ticket,
                           Task& task) {
  const int32_t n = g.n_tiles[entry.kind];
  const int32_t m = g.tiles_in_minibatch(mb);
  const int32_t size = m * n;
  if (ticket < size) {
    // (m-tile in the block, n-tile): n-tile major, or m-tile major.
    const bool n_major = entry.n_major || ((g.n_major_kinds >> entry.kind) & 1u) != 0u;
    task = {entry.kind, mb, mb * g.tiles_per_minibatch() + (n_major ? ticket % m : ticket / n),
            n_major ? ticket / m : ticket % n};
    return true;
  }
  ticket -= size;
  return false;
}
// The blocks of pipeline step s, entry by entry.
template <class Pass>
MOK_HD bool pipeline_step(const PassGeometry<Pass>& g, int32_t s, int32_t minibatches, int32_t& ticket, Task& task) {
  bool found = false;
  for_each_index<static_cast<int32_t>(sizeof(Pass::kPipeline) / sizeof(PipelineEntry))>([&](auto E) {
    constexpr PipelineEntry entry = Pass::kPipeline[E];
    const int32_t mb = s - (entry.lags ? g.effective_lookahead() : 0);
    if (!found && mb >= 0 && mb < minibatches) found = pipeline_block(g, entry, mb, ticket, task);
  });
  return found;
}
}  // namespace detail

// Ticket -> task. Every quotient is taken in 32 bits: tickets come from a
// 32-bit counter and the host refuses a pass that could have 2^31 tasks or
// more, so each dividend fits (64-bit divisions are function calls on the
// GPU, on the fetcher's path).
template <class Pass>
MOK_HD Task decode_task(const PassGeometry<Pass>& g, int64_t ticket64) {
  Task task{kNoTask, -1, -1, -1};
  if (ticket64 < 0 || ticket64 > 0x7fffffff) return task;
  int32_t ticket = static_cast<int32_t>(ticket64);
  // 1. The prologue: every task of each kind.
  bool found = false;
  for_each_index<static_cast<int32_t>(sizeof(Pass::kPrologue) / sizeof(int32_t))>([&](auto P) {
    constexpr int32_t kind = Pass::kPrologue[P];
    if (found) return;
    const int32_t n = g.n_tiles[kind];
    const int32_t size = g.kind_m_tiles(kind) * n;
    if (ticket < size) {
      task = {kind, -1, ticket / n, ticket % n};
      found = true;
    } else {
      ticket -= size;
    }
  });
  if (found) return task;

  // 2. The pipeline. Steps before every entry has started, one by one.
  constexpr int32_t kEntries = static_cast<int32_t>(sizeof(Pass::kPipeline) / sizeof(PipelineEntry));
  bool any_lag = false;
  for_each_index<kEntries>([&](auto E) { any_lag = any_lag || Pass::kPipeline[E].lags; });
  const int32_t M = g.minibatches();
  const int32_t max_lag = any_lag ? g.effective_lookahead() : 0;
  const int32_t last_step = M - 1 + max_lag;  // steps 0 .. last_step
  int32_t s = 0;
  for (; s < max_lag && s <= last_step; ++s) {
    if (detail::pipeline_step(g, s, M, ticket, task)) return task;
  }
  // Steady state, in closed form: every entry emits a full minibatch (only
  // the last minibatch may be short), i.e. steps s with s - lag in [0, M - 2]
  // for every entry: s in [max_lag, M - 2] (the leading entries have lag 0).
  const int32_t steady = M - 1 - max_lag > 0 ? M - 1 - max_lag : 0;
  int32_t full_step = 0;
  for_each_index<kEntries>([&](auto E) {
    full_step += g.tiles_per_minibatch() * g.n_tiles[Pass::kPipeline[E].kind];
  });
  if (steady > 0 && full_step > 0) {
    if (ticket < steady * full_step) {
      const int32_t step = s + ticket / full_step;
      int32_t in_step = ticket % full_step;
      detail::pipeline_step(g, step, M, in_step, task);
      return task;
    }
    ticket -= steady * full_step;
  }
  s += steady;
  // 3. The remaining steps (at most lookahead + 1), one by one.
  for (; s <= last_step; ++s) {
    if (detail::pipeline_step(g, s, M, ticket, task)) return task;
  }
  // 4. The token-reduced kinds (their K, the tokens, is the longest of the
  //    finale's: first, so that they do not end the pass).
  if constexpr (has_token_finale<Pass>()) {
    bool placed = false;
    for_each_index<token_finale_size<Pass>()>([&](auto F) {
      constexpr int32_t kind = Pass::kTokenFinale[F];
      if (placed) return;
      const int32_t n = g.n_tiles[kind];
      const int32_t size = g.expert_m_tiles[kind] * n;
      if (ticket < size) {
        task = {kind, -1, ticket / n, ticket % n};
        placed = true;
      } else {
        ticket -= size;
      }
    });
    if (placed) return task;
  }
  // 5. The finale: per-expert blocks, expert by expert; each expert's block
  //    has the same size (its kinds' output tiles), so in closed form too.
  if constexpr (has_finale<Pass>()) {
    int32_t per_expert = 0;
    for_each_index<finale_size<Pass>()>([&](auto F) {
      constexpr int32_t kind = Pass::kFinale[F];
      per_expert += g.expert_m_tiles[kind] * g.n_tiles[kind];
    });
    if (per_expert > 0 && ticket < g.local_experts * per_expert) {
      const int32_t expert = ticket / per_expert;
      int32_t in_expert = ticket % per_expert;
      bool placed = false;
      for_each_index<finale_size<Pass>()>([&](auto F) {
        constexpr int32_t kind = Pass::kFinale[F];
        const int32_t n = g.n_tiles[kind];
        const int32_t size = g.expert_m_tiles[kind] * n;
        if (placed) return;
        if (in_expert < size) {
          task = {kind, -1, expert * g.expert_m_tiles[kind] + in_expert / n, in_expert % n};
          placed = true;
        } else {
          in_expert -= size;
        }
      });
      return task;
    }
  }
  return Task{kNoTask, -1, -1, -1};
}

// The local expert of a per-expert kind's task (its m-tile is expert-major;
// a token-reduced kind's tasks give 0: one matrix).
template <class Pass>
MOK_HD int32_t expert_of_task(const PassGeometry<Pass>& g, const Task& t) {
  const int32_t per_expert = expert_m_tiles_of<Pass>(g, t.kind);
  return per_expert > 0 ? t.m_tile / per_expert : -1;
}

// ---- counter indices and targets ---------------------------------------------
// Where m-tile `m_tile` of the schedule sits in the ring (every ring shares
// the slot geometry): its ring-tile index, and its first ring row.
template <class Pass>
MOK_HD int32_t ring_tile_index(const PassGeometry<Pass>& g, int32_t m_tile) {
  const int32_t mb = m_tile / g.tiles_per_minibatch();
  return g.slot_of(mb) * g.tiles_per_minibatch() + (m_tile - mb * g.tiles_per_minibatch());
}
template <class Pass>
MOK_HD int32_t ring_row_of_tile(const PassGeometry<Pass>& g, int32_t m_tile) {
  return ring_tile_index(g, m_tile) * g.tile_m;
}

// Words a counter array takes.
template <class Pass>
MOK_HD int32_t counter_length(const PassGeometry<Pass>& g, Span span) {
  switch (span) {
    case Span::kRingTile: return g.ring_tiles();
    case Span::kRingSlot: return g.ring_slots;
    case Span::kTokenTile: return g.token_m_tiles;
    case Span::kWhole: return 1;
    case Span::kExpert:
      if constexpr (has_expert_work<Pass>()) return g.local_experts;
      return 0;
  }
  return 0;
}

// The index of `counter` that the work on (minibatch, m_tile) of local
// expert `expert` (per-expert counters only) waits on or signals, and that
// index's generation.
template <class Pass>
MOK_HD int32_t counter_index(const PassGeometry<Pass>& g, Span span, int32_t minibatch, int32_t m_tile,
                             int32_t expert = -1) {
  switch (span) {
    case Span::kRingTile: return ring_tile_index(g, m_tile);
    case Span::kRingSlot: return g.slot_of(minibatch);
    case Span::kTokenTile: return m_tile;
    case Span::kWhole: return 0;
    case Span::kExpert: return expert;
  }
  return 0;
}
MOK_HD constexpr bool span_cycles(Span span) { return span == Span::kRingTile || span == Span::kRingSlot; }

// Signals one index of `counter` receives per generation: one store, or one
// add per task of every kind that signals it (per ring tile: the m-tile's
// n-tiles; per slot: a full minibatch's; per token tile: its n-tiles; for
// the whole pass: every task of the kind; per expert: the expert's schedule
// m-tiles' n-tiles -- data, given as `expert_m_tiles` -- or a per-expert
// kind's tiles of that expert).
template <class Pass>
MOK_HD uint32_t signals_per_generation(const PassGeometry<Pass>& g, int32_t counter, int32_t expert_m_tiles = 0) {
  uint32_t total = 0;
  visit_kind_from<0, Pass::kNumCounters>(counter, [&](auto C) {
    constexpr CounterSpec spec = Pass::kCounters[C];
    if constexpr (spec.stores_generation) {
      total = 1;
    } else {
      for_each_index<Pass::kNumKinds>([&](auto K) {
        for_each_index<kMaxSignals>([&](auto I) {
          constexpr Span span = Pass::kCounters[index_of<decltype(C)>].span;
          if constexpr (Pass::kKinds[index_of<decltype(K)>].signals[index_of<decltype(I)>].counter == index_of<decltype(C)>) {
            uint32_t tiles = 1;
            if constexpr (span == Span::kRingSlot) tiles = static_cast<uint32_t>(g.tiles_per_minibatch());
            if constexpr (span == Span::kWhole) tiles = static_cast<uint32_t>(g.kind_m_tiles(K));
            if constexpr (span == Span::kExpert) {
              if constexpr (Pass::kKinds[index_of<decltype(K)>].rows == Rows::kExpert) {
                tiles = static_cast<uint32_t>(expert_m_tiles_of<Pass>(g, index_of<decltype(K)>));
              } else {
                tiles = static_cast<uint32_t>(expert_m_tiles);
              }
            }
            total += tiles * static_cast<uint32_t>(g.n_tiles[K]);
          }
        });
      });
    }
  });
  return total;
}

template <class Pass>
MOK_HD uint32_t wait_target(const PassGeometry<Pass>& g, CounterWait w, uint32_t generation,
                            int32_t expert_m_tiles = 0) {
  return (generation + (w.await == Await::kReady ? 1u : 0u)) * signals_per_generation(g, w.counter, expert_m_tiles);
}

}  // namespace mok::protocol
