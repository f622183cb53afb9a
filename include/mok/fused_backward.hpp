// The fused backward pass of one MoE layer, as one persistent kernel per pass
// (docs/backward-design.md): pull dispatch of every schedule row's dout and x,
// g = dout . W2 with the SwiGLU backward in its epilogue ([da | db], w h and
// the router-weight gradient's per-n-tile parts), dx_j = [da | db] . W13 into
// the owner's dx rows by schedule row (the home rank's combine finds each
// (token, slot)'s row there through dx_row_of), the routed weight gradients dW13[e]
// and dW2[e] (fp32, summed over each expert's rows in schedule order -- global
// token order -- so the bits do not depend on the world size), the shared
// expert's backward, and the combine on the home rank:
//   dx[t] = bf16(0 + dx_shared[t] + dx_0 + ... + dx_{k-1}) in fp32,
//   dweights[t][j] = the parts of (t, j) summed in n-tile order.
// Host API only.
//
// Every world the forward runs: the virtual world (R ranks as R partitions
// of the current GPU's SMs), the peer world (one process, one GPU per rank:
// options.devices) and the process world (one process per GPU:
// options.process_rank, CUDA IPC); host-ordered or device-ordered passes
// (options.device_ordered, always in the process world: the world barrier
// frames each pass, as in the forward); save and recompute modes
// (BackwardMode).
// Every gradient, the shared expert's weight gradients included (summed over
// the rank's own tokens in token order), comes out of the one kernel.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "mok/fused_forward.hpp"
#include "mok/layer_config.hpp"
#include "mok/pass_trace.hpp"

struct CUstream_st;

namespace mok {

// One rank's tensors, all in device memory on the rank's GPU (the current
// GPU in a virtual world, options.devices[r] in a peer world), bf16 as raw
// 16-bit storage, contiguous, 16-byte aligned (weights and dweights: 4-byte).
struct BackwardRankTensors {
  // What the forward read, unchanged since.
  const void* x = nullptr;              // bf16 [T, H]
  const float* weights = nullptr;       // [T, k]: the routing weights
  const void* w13 = nullptr;            // bf16 [E/R, 2I, H]
  const void* w2 = nullptr;             // bf16 [E/R, H, I]
  const void* shared_w13 = nullptr;     // bf16 [2S, H]; null when S = 0
  const void* shared_w2 = nullptr;      // bf16 [H, S]
  // What the forward's training pass kept for this rank (RankTensors of that
  // pass): its pass state (the schedule) and, in save mode, its
  // pre-activations (recompute mode does not read them: they may be null).
  const void* pass_state = nullptr;     // FusedForward::pass_state_bytes()
  const void* preact = nullptr;         // bf16 [FusedForward::saved_rows(), 2I]
  const void* shared_preact = nullptr;  // bf16 [T, 2S]; null when S = 0
  // The gradient of the loss with respect to the forward's out.
  const void* dout = nullptr;           // bf16 [T, H]
  // Outputs. The weight gradients' element type and whether they are added
  // to or overwritten is the pass's WeightGradOutput.
  void* dx = nullptr;                   // bf16 [T, H]
  float* dweights = nullptr;            // [T, k]
  void* dw13 = nullptr;                 // [E/R, 2I, H]: this rank's experts
  void* dw2 = nullptr;                  // [E/R, H, I]
  void* dshared_w13 = nullptr;          // [2S, H]: this rank's tokens' share (a data-parallel sum of them
  void* dshared_w2 = nullptr;           // [H, S]   over ranks is the layer's)
  // Optional: the forward pass's token count of this rank, at most the
  // layer's tokens_per_rank[r], which is then a capacity (as RankTensors::
  // tokens is for the forward: nothing is reallocated when the count changes
  // from pass to pass): x, weights, shared_preact, dout, dx and dweights hold
  // `tokens` rows. -1: tokens_per_rank[r]. The outputs are the bits an
  // object made for exactly these counts gives.
  int tokens = -1;
};

// How a pass writes the weight gradients: each is one fp32 sum per element
// (over its expert's rows in schedule order), then
enum class WeightGradOutput : int32_t {
  kFp32 = 0,            // stored as fp32, overwriting the buffer
  kAccumulateFp32 = 1,  // added to the fp32 buffer, once (gradient accumulation over micro-batches)
  kBf16 = 2,            // rounded once to bf16 (what autograd returns for bf16 weights)
};

// What the forward kept for the backward (docs/backward-design.md, "What the
// forward keeps"). Both modes give the same bits.
enum class BackwardMode : int32_t {
  // The forward's training pass kept the schedule (pass state) and the gate/up
  // pre-activations (RankTensors::preact, shared_preact).
  kSave = 0,
  // It kept the schedule only: the backward recomputes [gate | up] = W13 x
  // from the pulled x rows (and the shared expert's from x) before the tasks
  // that read them, into its own workspace (activation checkpointing: ~300 MB
  // less kept per layer on the DeepSeek-V3 slice, one more gate/up GEMM).
  kRecompute = 1,
};

class FusedBackward {
 public:
  // The layer, with the forward pass's token counts per rank, or a capacity
  // for them (then each pass gives its counts in BackwardRankTensors::tokens),
  // and the forward's options: the
  // same SM split, minibatch and lookahead rules and the same world
  // (options.devices, options.process_rank); ring_slots is replaced (the
  // backward's buffers hold the whole schedule); comm_ctas_per_rank 0 means
  // twice the forward's rule (the backward pulls two rows, dout and x, per
  // schedule row). Throws mok::Error, naming the field, for invalid values.
  // Allocates each rank's workspace on its GPU (a process world: its own
  // only, with room for the inputs its peers read).
  FusedBackward(const LayerConfig& config, const FusedForwardOptions& options = {},
                BackwardMode mode = BackwardMode::kSave);
  ~FusedBackward();
  FusedBackward(const FusedBackward&) = delete;
  FusedBackward& operator=(const FusedBackward&) = delete;

  // Enqueues one backward pass on `stream` (no host synchronisation; a peer
  // world uses each GPU's default stream). Throws mok::Error before launch on
  // missing or misaligned pointers. Passes of one object run one after
  // another (each waits for the previous one on the GPUs).
  void run(std::span<const BackwardRankTensors> ranks, CUstream_st* stream = nullptr,
           WeightGradOutput weight_grads = WeightGradOutput::kFp32);
  // The same with one stream per launch: one in a virtual world, one per
  // rank (on the rank's GPU) in a peer world.
  void run(std::span<const BackwardRankTensors> ranks, std::span<CUstream_st* const> streams,
           WeightGradOutput weight_grads);
  // A process world's pass (options.process_rank >= 0): this rank's tensors
  // only, on the current GPU; after import_peers() (unless the world has one
  // rank). Every rank must run every pass (device-ordered: the world barrier
  // frames each pass), with the layer's token counts.
  void run(const BackwardRankTensors& mine, CUstream_st* stream = nullptr,
           WeightGradOutput weight_grads = WeightGradOutput::kFp32);
  // accumulate: kAccumulateFp32, else kFp32.
  void run(std::span<const BackwardRankTensors> ranks, CUstream_st* stream, bool accumulate) {
    run(ranks, stream, accumulate ? WeightGradOutput::kAccumulateFp32 : WeightGradOutput::kFp32);
  }

  // The process world's exchange of workspaces, as FusedForward's: this
  // rank's handle (opaque bytes; every rank's go to every rank, e.g. by an
  // all-gather), the peers' mapped from theirs (once, every rank's handle in
  // rank order, this rank's included), and the mappings closed before the
  // peers free their workspaces. A forward's handle is refused here (and a
  // backward's there), as is one of another layer, options or mode.
  std::vector<uint8_t> export_handle() const;
  void import_peers(std::span<const std::vector<uint8_t>> handles);
  void close_peers();

  // Waits for the last pass, then throws mok::Error if it aborted (a stalled
  // wait, naming the counter, the ranks and the values).
  void check(CUstream_st* stream = nullptr);
  void check(std::span<CUstream_st* const> streams);  // the streams run() was given

  // The timeline of the last pass (options.trace_events > 0): waits for it,
  // then returns its events in no particular order (the forward's event
  // kinds; a GEMM event's detail is the backward's task kind,
  // protocol::BackwardPass::Kind, or BackwardRecomputePass::Kind in recompute
  // mode). Throws mok::Error if tracing is off or a
  // CTA recorded more than its share of trace_events.
  std::vector<TraceEvent> trace(CUstream_st* stream = nullptr);

  // Bytes of every rank's workspace together (for the docs and the
  // benchmarks), whichever process or GPU holds each (a process world
  // allocates its own rank's only).
  size_t workspace_bytes() const;
  const FusedForwardOptions& options() const;  // resolved
  BackwardMode mode() const;

 private:
  void enqueue(std::span<const BackwardRankTensors> ranks, std::span<CUstream_st* const> streams,
               WeightGradOutput weight_grads);

  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace mok
