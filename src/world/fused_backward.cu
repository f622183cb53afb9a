// The fused backward's facade (include/mok/fused_backward.hpp): validates the
// layer and options (the forward's rules, forward_options.cpp), lays out every
// rank's workspace (backward_layout.cpp) in the world the options pick (the
// forward's world code: world_core.hpp, world.hpp), checks each pass's
// tensors, and has its maps built (backward_tensor_maps.cu) and its steps
// enqueued (backward_steps.cu) through the same enqueue_pass as the
// forward's: counters zeroed, then the fused kernel (backward_kernel.cu),
// which computes every gradient, the shared expert's weight gradients
// included. What the object keeps is backward_state.hpp; its rank views in
// the kernel's parameters, backward_views.hpp.
#include "mok/fused_backward.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mok/error.hpp"
#include "plan/implemented_dtype.hpp"
#include "protocol/counters.hpp"
#include "world/backward_kernel.hpp"
#include "world/backward_layout.hpp"
#include "world/backward_state.hpp"
#include "world/backward_steps.hpp"
#include "world/backward_tensor_maps.hpp"
#include "world/backward_views.hpp"
#include "world/device_scope.hpp"
#include "world/forward_options.hpp"
#include "world/fused_kernel.hpp"
#include "world/pass_launch.hpp"
#include "world/pass_params.hpp"
#include "world/pass_report.hpp"
#include "world/rank_tensors.hpp"
#include "world/trace_memory.hpp"
#include "world/workspace_layout.hpp"
#include "world/world.hpp"
#include "world/world_core.hpp"

namespace mok {
namespace {

using protocol::BackwardPass;

// Rows read or written by TMA or 16-byte accesses need 16-byte alignment;
// the routing weights and their gradients are read and written one float at
// a time (kScalar).
constexpr uintptr_t kRows = 16, kScalar = 4;
void require_pointer(const void* p, const char* field, int rank, bool needed = true, uintptr_t alignment = kRows) {
  if (p == nullptr) {
    if (!needed) return;
    throw Error("FusedBackward::run: rank " + std::to_string(rank) + "'s " + field + " is null");
  }
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0) {
    throw Error("FusedBackward::run: rank " + std::to_string(rank) + "'s " + field + " is not " +
                std::to_string(alignment) + "-byte aligned");
  }
}

}  // namespace

struct FusedBackward::State : world::BackwardState {};

FusedBackward::FusedBackward(const LayerConfig& config, const FusedForwardOptions& options, BackwardMode mode)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  if (mode != BackwardMode::kSave && mode != BackwardMode::kRecompute) {
    throw Error("FusedBackward: unknown BackwardMode " + std::to_string(static_cast<int>(mode)));
  }
  s.mode = mode;
  // The forward accepts fp8 layers; the backward computes bf16 only and
  // says so before anything is sized by the wrong kernel's facts.
  plan::require_implemented_dtype(config, "the fused backward");
  const world::GpuFacts gpus = world::query_gpus();
  s.kernel = world::fused_kernel_facts(DType::kBF16);
  s.options = world::backward_options(config, options, world::resolve_options(config, options, s.kernel, gpus),
                                      s.kernel);
  s.config = config;
  s.pass_state = world::pass_state_layout(config, s.kernel);
  const world::WorldKind kind = world::world_kind(s.options);
  s.layout = world::backward_layout(config, s.options, s.kernel, mode, kind == world::WorldKind::kProcess);
  static_assert(device::kNumBackwardMaps == protocol::num_backward_maps<BackwardPass>(),
                "backward_layout sizes the maps region by the protocol's count");
  static_assert(device::FusedBackwardParams::kCounterSetTailWords == world::kCounterSetTailWords &&
                    device::FusedBackwardRecomputeParams::kCounterSetTailWords == world::kCounterSetTailWords,
                "backward_layout sizes the counter sets by the words the kernel clears");

  const int R = config.world_size;
  world::WorldCore& core = s.core;
  core.place(kind, R, world::rank_devices(config, s.options, gpus), s.options.process_rank,
             s.options.device_ordered);
  s.world = world::make_world(core.kind);
  s.world->connect(core);
  core.launches = s.world->launches(core);
  core.allocate_report_words(static_cast<size_t>(R) * static_cast<size_t>(s.options.ctas_per_rank),
                             s.options.trace_events);
  // The counter sets and barrier words start at zero; device-ordered passes
  // never zero them from the host again.
  for (int r = 0; r < R; ++r) {
    const world::BackwardRankLayout& g = s.layout.ranks[static_cast<size_t>(r)];
    if (s.world->allocates(r)) core.allocate_workspace(r, g.bytes, world::zeroed_at_creation(g));
  }
  core.create_pass_events();
  for (const world::Launch& launch : core.launches) {
    world::DeviceScope on(launch.device);
    world::allow_backward_kernel_smem(core.system_scope());
  }

  const world::TraceMemory trace{core.trace_memory, core.trace_blocks, core.trace_per_block};
  s.with_params([&](auto& p) {
    world::fill_pass_params(p, config, s.options, s.kernel.tile_m);
    p.epoch = 0;
    p.barrier_timeout_ns = static_cast<uint64_t>(s.options.barrier_timeout_seconds * 1e9);
    p.trace = nullptr;
    p.trace_count = nullptr;
    p.trace_capacity = 0;
    if (trace.memory != nullptr) {
      p.trace_count = trace.counts();
      p.trace = trace.events();
      p.trace_capacity = static_cast<uint32_t>(trace.per_block);
    }
    for (int r = 0; r < R; ++r) {
      p.ranks[r].tokens = config.tokens_per_rank[static_cast<size_t>(r)];
      if (core.rank_base[static_cast<size_t>(r)] != nullptr) world::fill_backward_view(s, p, r);
    }
    // Counters are bound per pass (bind_counters).
  });
}


FusedBackward::~FusedBackward() = default;

size_t FusedBackward::workspace_bytes() const { return state_->layout.bytes; }
const FusedForwardOptions& FusedBackward::options() const { return state_->options; }
BackwardMode FusedBackward::mode() const { return state_->mode; }

void FusedBackward::run(std::span<const BackwardRankTensors> ranks, CUstream_st* stream,
                        WeightGradOutput weight_grads) {
  if (state_->core.kind == world::WorldKind::kPeer) {
    // Each GPU's default stream, as the forward's peer world takes.
    const std::vector<CUstream_st*> streams(state_->core.launches.size(), nullptr);
    run(ranks, streams, weight_grads);
    return;
  }
  run(ranks, std::span<CUstream_st* const>(&stream, 1), weight_grads);
}

void FusedBackward::run(std::span<const BackwardRankTensors> ranks, std::span<CUstream_st* const> streams,
                        WeightGradOutput weight_grads) {
  const State& s = *state_;
  if (s.core.kind == world::WorldKind::kProcess) {
    throw Error("FusedBackward::run: a process world runs only this rank's tensors: run(mine, stream)");
  }
  if (static_cast<int>(ranks.size()) != s.config.world_size) {
    throw Error("FusedBackward::run: got " + std::to_string(ranks.size()) + " ranks' tensors for a world of " +
                std::to_string(s.config.world_size));
  }
  enqueue(ranks, streams, weight_grads);
}

void FusedBackward::run(const BackwardRankTensors& mine, CUstream_st* stream, WeightGradOutput weight_grads) {
  const State& s = *state_;
  if (s.core.kind != world::WorldKind::kProcess) {
    throw Error("FusedBackward::run(mine): only a process world (options.process_rank >= 0) runs one rank's "
                "tensors");
  }
  if (!s.world->ready_to_run(s.core)) {
    throw Error("FusedBackward::run: call import_peers() with every rank's handle first (the peers' workspaces "
                "are not mapped)");
  }
  enqueue(std::span<const BackwardRankTensors>(&mine, 1), std::span<CUstream_st* const>(&stream, 1), weight_grads);
}

// `ranks`: the tensors of the ranks this object's launches serve, from the
// first launch's first rank on (every rank, or a process world's own).
void FusedBackward::enqueue(std::span<const BackwardRankTensors> ranks, std::span<CUstream_st* const> streams,
                            WeightGradOutput weight_grads) {
  State& s = *state_;
  const LayerConfig& c = s.config;
  const int first = s.core.launches.front().first_rank;
  const int served = static_cast<int>(ranks.size());
  if (streams.size() != s.core.launches.size()) {
    throw Error("FusedBackward::run: got " + std::to_string(streams.size()) + " streams; this " +
                (s.core.kind == world::WorldKind::kPeer ? "peer world needs one per rank (" : "world needs one (") +
                std::to_string(s.core.launches.size()) + ")");
  }
  // Refused before anything of this pass is touched.
  const std::vector<cudaStream_t> cuda_streams(streams.begin(), streams.end());
  if (world::any_capturing(s.core, cuda_streams)) {
    // Each pass uploads its tensor maps from host memory that lives only
    // through this call: a graph replaying the copy would read freed memory.
    throw Error("FusedBackward::run: a backward pass cannot be captured in a CUDA graph (its tensor maps are "
                "built on the host and uploaded by each pass); run it outside the capture");
  }
  world::require_orderable(s.core, /*capturing=*/false, "FusedBackward::run");
  const bool accumulate = weight_grads == WeightGradOutput::kAccumulateFp32;
  const bool bf16_grads = weight_grads == WeightGradOutput::kBf16;
  if (!accumulate && !bf16_grads && weight_grads != WeightGradOutput::kFp32) {
    throw Error("FusedBackward::run: unknown WeightGradOutput " + std::to_string(static_cast<int>(weight_grads)));
  }
  const bool shared = c.shared_width() > 0;
  std::vector<int32_t> pass_tokens(static_cast<size_t>(c.world_size));
  for (int r = 0; r < c.world_size; ++r) pass_tokens[static_cast<size_t>(r)] = c.tokens_per_rank[static_cast<size_t>(r)];
  for (int r = first; r < first + served; ++r) {
    const BackwardRankTensors& t = ranks[static_cast<size_t>(r - first)];
    pass_tokens[static_cast<size_t>(r)] =
        world::checked_pass_tokens(c, t.tokens, r, "FusedBackward::run: rank " + std::to_string(r) + ": ");
    // A device-ordered pass clears its idle counter set by its own token
    // tiles (world_barrier_role.cuh): below capacity it would leave the set's
    // tail stale for the pass after next.
    if (s.core.device_ordered() && pass_tokens[static_cast<size_t>(r)] != c.tokens_per_rank[static_cast<size_t>(r)]) {
      throw Error("FusedBackward::run: rank " + std::to_string(r) + ": device-ordered passes run the layer's token "
                  "counts (tokens must be -1 or tokens_per_rank[r]); use host-ordered passes for fewer tokens");
    }
    const bool tokens = pass_tokens[static_cast<size_t>(r)] > 0;
    require_pointer(t.x, "x", r, tokens);
    require_pointer(t.weights, "weights", r, tokens, kScalar);
    require_pointer(t.dout, "dout", r, tokens);
    require_pointer(t.dx, "dx", r, tokens);
    require_pointer(t.dweights, "dweights", r, tokens, kScalar);
    require_pointer(t.w13, "w13", r);
    require_pointer(t.w2, "w2", r);
    require_pointer(t.dw13, "dw13", r);
    require_pointer(t.dw2, "dw2", r);
    require_pointer(t.pass_state, "pass_state (the forward's, which holds its schedule)", r);
    const bool save = s.mode == BackwardMode::kSave;  // recompute mode reads no pre-activations
    require_pointer(t.preact, "preact (save mode: the training forward's pre-activations)", r, save);
    if (shared) {
      require_pointer(t.shared_w13, "shared_w13", r);
      require_pointer(t.shared_w2, "shared_w2", r);
      require_pointer(t.shared_preact, "shared_preact", r, tokens && save);
      require_pointer(t.dshared_w13, "dshared_w13", r);
      require_pointer(t.dshared_w2, "dshared_w2", r);
    }
  }

  // This pass's token counts: the kernel derives its token tiles from them
  // (the workspace is sized for the capacity), and the maps below read them.
  s.with_params([&](auto& params) {
    for (int r = 0; r < c.world_size; ++r) params.ranks[r].tokens = pass_tokens[static_cast<size_t>(r)];
  });

  const world::BackwardMaps maps = world::encode_backward_maps(s, ranks, bf16_grads);

  world::enqueue_backward_pass(s, ranks, maps, accumulate, bf16_grads, cuda_streams);
}

namespace {

// The last pass's report, once it has finished: a clear error if it aborted.
void throw_if_backward_aborted(world::BackwardState& s) {
  world::PassReport report;
  if (!s.core.device_ordered()) {
    report = s.core.read_report_words();
  } else {
    if (s.core.epoch == 0) return;
    // A barrier that gave up breaks the world for good and explains any other report.
    std::vector<size_t> barrier_offset;
    for (const world::BackwardRankLayout& g : s.layout.ranks) barrier_offset.push_back(g.barrier.offset);
    world::throw_if_barrier_broke(s.core, barrier_offset, s.options.barrier_timeout_seconds, "fused backward",
                                  s.options.describe());
    report = world::device_ordered_backward_report(s);
  }
  if (report.abort == 0) return;
  const protocol::StallReport& stall = report.stall;
  if (static_cast<protocol::CounterId>(stall.counter) == protocol::CounterId::kScheduleOverflow) {
    throw Error("fused backward: rank " + std::to_string(stall.waiter) + "'s schedule (its pass state) has " +
                std::to_string(stall.observed) + " padded rows, more than the " + std::to_string(stall.target) +
                " this FusedBackward's buffers hold: it comes from a forward of another layer or of more tokens "
                "(make the FusedBackward for the forward pass's token counts, or for a capacity at least as large)");
  }
  throw Error(std::string("fused backward: the pass aborted: rank ") + std::to_string(stall.waiter) +
              " waited on " + protocol::counter_name(static_cast<protocol::CounterId>(stall.counter)) + "[" +
              std::to_string(stall.index) + "] of rank " + std::to_string(stall.owner) + " for " +
              std::to_string(stall.target) + " and saw " + std::to_string(stall.observed) +
              " before the timeout");
}

}  // namespace

void FusedBackward::check(CUstream_st* stream) {
  if (state_->core.kind == world::WorldKind::kPeer) {  // one stream cannot name one on each GPU
    world::wait_for_last_pass_on_every_gpu(state_->core);
    throw_if_backward_aborted(*state_);
    return;
  }
  check(std::span<CUstream_st* const>(&stream, 1));
}

void FusedBackward::check(std::span<CUstream_st* const> streams) {
  world::wait_for_last_pass(state_->core, std::vector<cudaStream_t>(streams.begin(), streams.end()));
  throw_if_backward_aborted(*state_);
}

std::vector<uint8_t> FusedBackward::export_handle() const {
  return state_->world->export_handle(state_->core, world::backward_exchange(*state_));
}

void FusedBackward::import_peers(std::span<const std::vector<uint8_t>> handles) {
  State& s = *state_;
  s.world->import_peers(s.core, world::backward_exchange(s), handles);
  s.core.report_at_close.reset();
}

void FusedBackward::close_peers() { state_->world->close_peers(state_->core, world::backward_exchange(*state_)); }

std::vector<TraceEvent> FusedBackward::trace(CUstream_st* stream) {
  State& s = *state_;
  if (s.core.trace_memory == nullptr) throw Error("FusedBackward::trace: tracing is off (options.trace_events = 0)");
  check(stream);
  return s.core.read_trace("FusedBackward::trace", s.options.trace_events);
}

}  // namespace mok
