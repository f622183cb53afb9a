// The fused forward pass of one MoE layer over a world of R ranks, as one
// persistent kernel: in-kernel schedule, pull dispatch into a ring, gate/up +
// SwiGLU, down, combine into home-rank rows, shared expert, fp32 weighted sum.
// Host API only.
//
// Three worlds run the same kernel through the same pointer table:
// - the *virtual* world (options.devices empty): R ranks as R partitions of the
//   SMs of the current GPU, each with its own buffers, reading its peers only
//   through the table, exactly as it would read peers over NVLink;
// - the *peer* world (options.devices = one GPU per rank): one process drives
//   every GPU, with peer access enabled between all of them; rank r's
//   workspace lives on devices[r], one launch per GPU, counters at system scope;
// - the *process* world (options.process_rank >= 0): one process per GPU (e.g.
//   under torchrun); this object is rank process_rank only, on the current
//   GPU. Ranks exchange their workspaces as CUDA IPC handles (export_handle,
//   then import_peers with every rank's handle, over any channel) and order
//   their passes on the GPUs (device-ordered passes, below).
//
// Passes are *host-ordered* by default: the host zeroes the counters before
// each pass (in a peer world after ordering the GPUs with events). With
// options.device_ordered (always in a process world) the kernel orders them
// itself: a start and an end barrier in every pass and two counter sets used
// in alternate passes, each zeroed on the GPU (docs/protocol.md,
// "Device-ordered passes"); the host never touches the counters again.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mok/layer_config.hpp"
#include "mok/pass_trace.hpp"

struct CUstream_st;

namespace mok {

// The options a caller tunes per shape: int fields of FusedForwardOptions,
// X(name) each. mok_cli (as --name with dashes, and in --compare sets) and
// the torch ops (keyword arguments, and the op cache's key) walk this one
// list, so an option added here reaches all of them at once.
#define MOK_FOR_EACH_TUNING_OPTION(X) \
  X(minibatch_rows)                   \
  X(ring_slots)                       \
  X(lookahead)                        \
  X(ctas_per_rank)                    \
  X(comm_ctas_per_rank)

struct FusedForwardOptions {
  int minibatch_rows = 2048;  // rows per ring slot; a multiple of 128, the GEMM tile's height (2048: 1.2-3.3%
                              // faster than 1024 on the DeepSeek-V3, GLM-4.5 and Qwen3 slices, docs/perf-notes.md f7)
  int ring_slots = 4;         // ring (macrobatch) = ring_slots * minibatch_rows rows per rank
  int lookahead = 2;          // gate/up minibatches taken ahead of a minibatch's down tasks
                              // (capped at ring_slots; docs/protocol.md)
  int ctas_per_rank = 0;      // SMs per rank; 0 = all SMs / R
  int comm_ctas_per_rank = 0; // of those, dispatch CTAs; 0 = enough to feed the GEMMs, from the layer's
                              // rows per FLOP (4 of 132 for DeepSeek-V3 at EP 8, 30 for Qwen3-30B-A3B)
  double timeout_seconds = 5.0;  // in (0, 8]: a wait longer than this aborts the pass with an error
  std::vector<int> devices;   // empty: virtual world on the current GPU; else devices[r] serves rank r
  int trace_events = 0;       // > 0: record a timeline of each pass, up to this many events in all,
                              // shared equally by the world's CTAs (trace())
  bool device_ordered = false;  // order passes by in-kernel barriers, not host-side zeroing (see above)
  int process_rank = -1;        // >= 0: a process world, this object being that rank (forces device_ordered)
  double barrier_timeout_seconds = 60.0;  // device-ordered: how long a rank waits for the others to start
                                          // or finish a pass, in (0, 3600] (hosts of a process world drift)

  std::string describe() const;
};

// One rank's tensors, all in device memory, bf16 as raw 16-bit storage.
// An fp8 layer (LayerConfig::dtype kFP8E4M3, docs/fp8-forward-design.md)
// takes its routed experts' weights in block-scaled FP8 instead: w13 and w2
// hold e4m3 bytes (mok::fp8::quantize_weight's `values`, same shapes) and
// w13_scales / w2_scales their ue8m0 scales; x, out and the shared expert
// stay bf16 (the kernel quantizes x itself, bit for bit as
// mok::fp8::quantize_rows does).
struct RankTensors {
  const void* x = nullptr;              // bf16 [T, H], contiguous, 16-byte aligned
  const int32_t* expert_ids = nullptr;  // [T, k] global ids
  const float* weights = nullptr;       // [T, k]
  void* out = nullptr;                  // bf16 [T, H]
  const void* w13 = nullptr;            // bf16 (fp8: e4m3) [E/R, 2I, H]: this rank's experts, gate rows then up rows
  const void* w2 = nullptr;             // bf16 (fp8: e4m3) [E/R, H, I]
  const void* shared_w13 = nullptr;     // bf16 [2S, H]; null when S = 0
  const void* shared_w2 = nullptr;      // bf16 [H, S]
  // fp8 layers only (null otherwise), mok::fp8::quantize_weight's `scales`:
  // one ue8m0 byte (2^(byte - 127)) per 128 x 128 block, row-major, any
  // alignment (read a byte at a time).
  const void* w13_scales = nullptr;     // ue8m0 [E/R, 2I / 128, H / 128]
  const void* w2_scales = nullptr;      // ue8m0 [E/R, H / 128, I / 128]
  // Optional: where this pass keeps what a later pass of the same layer needs
  // (its schedule, which the backward reads: BackwardRankTensors::pass_state): pass_state_bytes()
  // bytes of this rank's GPU, 16-byte aligned, owned by the caller, who keeps
  // one per layer. Null: the world's own, which the next pass overwrites.
  void* pass_state = nullptr;
  // Optional, training mode (save): where this rank keeps the gate/up
  // pre-activations the backward would otherwise recompute, rounded once to
  // bf16 from the accumulators h comes from (so a recompute with the grouped
  // GEMM gives the same bits). 16-byte aligned, this rank's GPU, caller-owned:
  //   preact        bf16 [saved_rows(), 2I]: row i = row i of this rank's
  //                 schedule (its pass_state, which must then be given too),
  //                 gate columns then up columns; padding rows are not written
  //   shared_preact bf16 [T, 2S]: row = token (needs a shared expert)
  // Null: not kept. A pass with either runs the training instantiation of
  // the kernel; its outputs are the same bits as without. Not in an fp8
  // layer (mok::Error): the FP8 forward has no training mode.
  void* preact = nullptr;
  void* shared_preact = nullptr;
  // Optional: this pass's token count of this rank, at most the layer's
  // tokens_per_rank[r], which is then a capacity (the workspace is sized for
  // it, nothing is reallocated when the count changes from pass to pass):
  // x, expert_ids, weights, out and shared_preact hold `tokens` rows.
  // -1: tokens_per_rank[r]. Host-ordered virtual and peer worlds only (the
  // ranks of a process world know each other's counts from the layer, and a
  // device-ordered pass clears its counters by its own counts). The outputs
  // are the bits an object made for exactly these counts gives.
  int tokens = -1;
};

class FusedForward {
 public:
  // Validates config and options (throws mok::Error naming the field) and
  // allocates every rank's workspace on the current device.
  FusedForward(const LayerConfig& config, const FusedForwardOptions& options = {});
  ~FusedForward();
  FusedForward(const FusedForward&) = delete;
  FusedForward& operator=(const FusedForward&) = delete;

  // Enqueues one forward pass on `stream`; no host synchronisation. Throws
  // mok::Error before launch on bad pointers. The passes of one object run
  // one after another even when the caller switches streams: each waits, on
  // the GPU, for the end of the previous one before it touches the workspace
  // that every pass reuses. A pass captured in a CUDA graph is not: the
  // caller orders its replays against the object's other passes, captures
  // only with the tensors of the previous pass (else mok::Error: tensor maps
  // are built on the host), and replays only while the object's passes use
  // those tensors. Its kernel needs every SM of the GPU at once (a
  // cooperative launch: it fails rather than hang). In a peer world the pass
  // runs on each GPU's legacy default stream.
  void run(std::span<const RankTensors> ranks, CUstream_st* stream = nullptr);
  // Peer world: streams[r] is a stream of devices[r] (null: its default
  // stream). The GPUs order themselves with events, never the host: a pass
  // starts on any GPU only after every GPU finished the previous one and
  // zeroed its counters.
  void run(std::span<const RankTensors> ranks, std::span<CUstream_st* const> streams);

  // Process world: this rank's pass (mine: this rank's tensors only). Every
  // rank must call it, the same number of times, in the same order relative to
  // any other collective work; the GPUs wait for each other inside the kernel.
  // Copies x and expert_ids into this rank's workspace (peers read them there).
  void run(const RankTensors& mine, CUstream_st* stream = nullptr);
  // Process world: this rank's workspace as opaque bytes (a CUDA IPC handle
  // and a description to check against), for every other rank.
  std::vector<uint8_t> export_handle() const;
  // Process world: handles[q] = rank q's export_handle() for every rank q (this
  // rank's own entry is checked, not opened). Once, before the first run.
  void import_peers(std::span<const std::vector<uint8_t>> handles);
  // Process world: unmaps the peers' workspaces. Destroying a process world is
  // collective: every rank calls close_peers(), then all meet at a barrier
  // (e.g. torch.distributed.barrier()), then each destroys its object (which
  // frees the memory its peers had mapped).
  void close_peers();

  // Waits for the last pass wherever it ran (on any stream of any of the
  // world's GPUs; the given streams are synchronized instead only before the
  // first pass or after a captured one -- and a peer world's single-stream
  // check, which cannot name a stream on each GPU, synchronizes each of its
  // GPUs as a whole there), then throws mok::Error if it
  // aborted: a stalled wait (names the counter, ranks, target and observed
  // value) or a bad routing entry (names rank, token, slot and the id). Also
  // after close_peers(): the report was kept when the peers were unmapped.
  void check(CUstream_st* stream = nullptr);
  void check(std::span<CUstream_st* const> streams);

  // The timeline of the last pass (options.trace_events > 0): waits for it,
  // then returns its events in no particular order. Throws mok::Error if
  // tracing is off or a CTA recorded more than its share of trace_events.
  std::vector<TraceEvent> trace(CUstream_st* stream = nullptr);

  // Bytes of one rank's pass state (RankTensors::pass_state): the same for
  // every rank and every pass of this object.
  size_t pass_state_bytes() const;
  // Rows of one rank's RankTensors::preact: its schedule's capacity (every
  // routed row it may own, each expert padded to the tile height).
  int64_t saved_rows() const;
  // The same for any object of this layer, without making one (no GPU needed).
  static int64_t saved_rows_for(const LayerConfig& config);
  // Where a pass state holds the schedule the backward reads (byte offsets
  // from RankTensors::pass_state; int32 values): expert_rows [E/R] real rows
  // per local expert, expert_offset [E/R + 1] their padded start rows (the
  // last is the schedule's padded length), rows [saved_rows()][3] the home
  // (rank, token, slot) of each schedule row, rank -1 for padding.
  struct PassStateRegions {
    size_t expert_rows = 0;
    size_t expert_offset = 0;
    size_t rows = 0;
  };
  PassStateRegions pass_state_regions() const;

  const LayerConfig& config() const;
  const FusedForwardOptions& options() const;  // with the defaults resolved

 private:
  void check_report();  // throws if the world's stall report is set
  void launch(std::span<const RankTensors> ranks, std::span<CUstream_st* const> streams);

  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace mok
