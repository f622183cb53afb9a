// The fused forward's facade: validates the config and options
// (forward_options.cpp), lays out every rank's workspace
// (workspace_layout.cpp), picks the world (virtual_world.cu, peer_world.cu,
// process_world.cu) and drives its passes (pass_launch.cu), then reads back
// what they report (pass_report.cu, and the trace through world_core.hpp).
#include "mok/fused_forward.hpp"

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "mok/error.hpp"
#include "protocol/pass_forward.hpp"
#include "protocol/pass_forward_fp8.hpp"
#include "world/device_scope.hpp"
#include "world/forward_options.hpp"
#include "world/fused_kernel.hpp"
#include "world/pass_launch.hpp"
#include "world/pass_report.hpp"
#include "world/rank_tensors.hpp"
#include "world/workspace_layout.hpp"
#include "world/world.hpp"
#include "world/world_state.hpp"

namespace mok::world {

GpuFacts query_gpus() {
  world::GpuFacts gpus;
  int count = 0;
  MOK_CUDA_CHECK(cudaGetDeviceCount(&count));
  MOK_CUDA_CHECK(cudaGetDevice(&gpus.current_device));
  gpus.sm_count.resize(static_cast<size_t>(count));
  gpus.l2_bytes.resize(static_cast<size_t>(count));
  for (int d = 0; d < count; ++d) {
    MOK_CUDA_CHECK(cudaDeviceGetAttribute(&gpus.sm_count[static_cast<size_t>(d)], cudaDevAttrMultiProcessorCount, d));
    int l2 = 0;
    MOK_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, d));
    gpus.l2_bytes[static_cast<size_t>(d)] = l2;
  }
  return gpus;
}

}  // namespace mok::world

namespace mok {

using world::WorldKind;

// Declared in this order on purpose: the world (which may hold IPC mappings
// of the state's memory) goes before the state.
struct FusedForward::State {
  world::WorldState state;
  std::unique_ptr<world::World> world;
};

namespace {

std::vector<cudaStream_t> as_streams(std::span<CUstream_st* const> streams) {
  return std::vector<cudaStream_t>(streams.begin(), streams.end());
}

// The kinds whose pipeline blocks run n-tile major for this layer
// (forward_n_major_kinds), in the table of the layer's dtype.
template <class Pass>
uint32_t n_major_kinds_of(const world::WorldState& s, const world::GpuFacts& gpus) {
  const protocol::PassGeometry<Pass> g =
      protocol::pass_geometry<Pass>(world::pass_shape(s.config, s.options, s.kernel), 0, 0);
  return world::forward_n_major_kinds(s.config, s.options, gpus, s.kernel, Pass::kGateUp, g.n_tiles[Pass::kGateUp]);
}

}  // namespace

FusedForward::FusedForward(const LayerConfig& config, const FusedForwardOptions& options)
    : state_(std::make_unique<State>()) {
  world::WorldState& s = state_->state;
  const world::GpuFacts gpus = world::query_gpus();
  s.kernel = world::fused_kernel_facts(config.dtype);
  s.options = world::resolve_options(config, options, s.kernel, gpus);
  s.config = config;
  world::require_kernel_tiles(config, s.options, s.kernel);
  world::require_task_bound(config, s.options, s.kernel);

  const int R = config.world_size;
  s.place(world::world_kind(s.options), R, world::rank_devices(config, s.options, gpus), s.options.process_rank,
          s.options.device_ordered);
  state_->world = world::make_world(s.kind);
  world::World& w = *state_->world;
  w.connect(s);
  s.launches = w.launches(s);
  if (!s.device_ordered()) {
    s.allocate_report_words(static_cast<size_t>(R) * static_cast<size_t>(s.options.ctas_per_rank),
                            s.options.trace_events);
  }
  s.n_major_kinds = config.dtype == DType::kFP8E4M3 ? n_major_kinds_of<protocol::ForwardFp8Pass>(s, gpus)
                                                     : n_major_kinds_of<protocol::ForwardPass>(s, gpus);
  s.fill_params();
  for (int r = 0; r < R; ++r) {
    // Every rank's layout (a process world reads its peers' memory by it),
    // but memory only for the ranks this object serves.
    s.layouts.push_back(world::rank_layout(config, s.options, s.kernel, r, s.kind == WorldKind::kProcess));
  }
  s.pass_state = world::pass_state_layout(config, s.kernel);
  for (int r = 0; r < R; ++r) {
    if (w.allocates(r)) s.allocate_rank(r);
  }
  s.create_pass_events();
  for (const world::Launch& launch : s.launches) {
    world::DeviceScope on(launch.device);
    world::allow_fused_kernel_smem(s.system_scope(), config.dtype == DType::kFP8E4M3);
  }
}

FusedForward::~FusedForward() = default;

size_t FusedForward::pass_state_bytes() const { return state_->state.pass_state.bytes; }
int64_t FusedForward::saved_rows() const { return world::schedule_row_capacity(state_->state.config, state_->state.kernel); }
int64_t FusedForward::saved_rows_for(const LayerConfig& config) {
  return world::schedule_row_capacity(config, world::fused_kernel_facts(config.dtype));
}
FusedForward::PassStateRegions FusedForward::pass_state_regions() const {
  const world::PassStateLayout& L = state_->state.pass_state;
  static_assert(sizeof(RowSource) == 3 * sizeof(int32_t), "a schedule row is (rank, token, slot) as int32");
  return {L.expert_rows.offset, L.expert_offset.offset, L.rows.offset};
}
const LayerConfig& FusedForward::config() const { return state_->state.config; }
const FusedForwardOptions& FusedForward::options() const { return state_->state.options; }

void FusedForward::run(std::span<const RankTensors> ranks, CUstream_st* stream) {
  if (state_->state.kind == WorldKind::kPeer) {
    const std::vector<CUstream_st*> streams(state_->state.rank_device.size(), nullptr);
    run(ranks, streams);
    return;
  }
  run(ranks, std::span<CUstream_st* const>(&stream, 1));
}

void FusedForward::run(std::span<const RankTensors> ranks, std::span<CUstream_st* const> streams) {
  world::WorldState& s = state_->state;
  const int R = s.config.world_size;
  if (s.kind == WorldKind::kProcess) {
    throw Error("run: a process world runs only this rank's tensors: run(mine, stream)");
  }
  if (static_cast<int>(ranks.size()) != R) {
    throw Error("run: got tensors for " + std::to_string(ranks.size()) + " ranks; world_size is " + std::to_string(R));
  }
  if (streams.size() != s.launches.size()) {
    throw Error("run: got " + std::to_string(streams.size()) + " streams; this " +
                (s.kind == WorldKind::kPeer ? "peer world needs one per rank (" : "virtual world needs one (") +
                std::to_string(s.launches.size()) + ")");
  }
  for (int r = 0; r < R; ++r) {
    world::check_rank_tensors(s.config, ranks[static_cast<size_t>(r)], r);
    // A device-ordered pass clears its idle counter set at its end, sized by
    // the pass's own token tiles (world_barrier_role.cuh); below capacity it
    // would leave the set's tail stale for the pass after next.
    if (s.device_ordered() && world::pass_tokens(s.config, ranks[static_cast<size_t>(r)], r) !=
                                  s.config.tokens_per_rank[static_cast<size_t>(r)]) {
      throw Error("run: rank " + std::to_string(r) + ": device-ordered passes run the layer's token counts "
                  "(tokens must be -1 or tokens_per_rank[r]); use host-ordered passes for fewer tokens");
    }
  }
  launch(ranks, streams);
}

void FusedForward::run(const RankTensors& mine, CUstream_st* stream) {
  world::WorldState& s = state_->state;
  if (s.kind != WorldKind::kProcess) {
    throw Error("run(mine): only a process world (options.process_rank >= 0) runs one rank's tensors");
  }
  if (!state_->world->ready_to_run(s)) {
    throw Error("run: call import_peers() with every rank's handle first (the peers' workspaces are not mapped)");
  }
  world::check_rank_tensors(s.config, mine, s.options.process_rank);
  if (mine.tokens >= 0 && mine.tokens != s.config.tokens_per_rank[static_cast<size_t>(s.options.process_rank)]) {
    throw Error("run(mine): a process world's token counts are the layer's (its ranks know each other's from it): "
                "tokens must be -1 or tokens_per_rank[rank]");
  }
  launch(std::span<const RankTensors>(&mine, 1), std::span<CUstream_st* const>(&stream, 1));
}

void FusedForward::launch(std::span<const RankTensors> ranks, std::span<CUstream_st* const> streams) {
  world::launch_pass(state_->state, *state_->world, std::vector<RankTensors>(ranks.begin(), ranks.end()),
                     as_streams(streams));
}

namespace {

// What the process world's exchange needs of the forward: its layout's
// fingerprint and sizes; a mapped peer's views; its last report, kept
// before the mappings (rank 0's workspace holds it) close.
world::WorkspaceExchange forward_exchange(world::WorldState& s) {
  world::WorkspaceExchange exchange;
  exchange.fingerprint = world::layout_fingerprint(s.config, s.options, s.kernel);
  for (const world::RankLayout& L : s.layouts) exchange.bytes.push_back(L.bytes);
  exchange.mapped = [&s](int q) { s.fill_view(q); };
  exchange.closing = [&s] { s.report_at_close = world::read_pass_report(s); };
  return exchange;
}

}  // namespace

std::vector<uint8_t> FusedForward::export_handle() const {
  return state_->world->export_handle(state_->state, forward_exchange(state_->state));
}

void FusedForward::import_peers(std::span<const std::vector<uint8_t>> handles) {
  world::WorldState& s = state_->state;
  state_->world->import_peers(s, forward_exchange(s), handles);
  s.report_at_close.reset();
}

void FusedForward::close_peers() { state_->world->close_peers(state_->state, forward_exchange(state_->state)); }

void FusedForward::check(std::span<CUstream_st* const> streams) {
  world::wait_for_last_pass(state_->state, as_streams(streams));
  check_report();
}

void FusedForward::check(CUstream_st* stream) {
  if (state_->state.kind == WorldKind::kPeer) {  // one stream cannot name one on each GPU
    world::wait_for_last_pass_on_every_gpu(state_->state);
    check_report();
    return;
  }
  check(std::span<CUstream_st* const>(&stream, 1));
}

void FusedForward::check_report() { world::throw_if_aborted(state_->state); }

std::vector<TraceEvent> FusedForward::trace(CUstream_st* stream) {
  if (state_->state.trace_memory == nullptr) {
    throw Error("trace: tracing is off (set FusedForwardOptions::trace_events)");
  }
  check(stream);
  return state_->state.read_trace("trace", state_->state.options.trace_events);
}

}  // namespace mok
