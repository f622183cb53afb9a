// The fused backward's facade (include/mok/fused_backward.hpp): validates the
// layer and options (the forward's rules, forward_options.cpp), lays out every
// rank's workspace (backward_layout.cpp) in the world the options pick (the
// forward's world code: world_core.hpp, world.hpp), builds the backward's
// tensor maps, and enqueues each pass through the same steps as the forward
// (enqueue_pass, pass_launch.hpp): counters zeroed, then the fused kernel
// (backward_kernel.cu), which computes every gradient, the shared expert's
// weight gradients included.
#include "mok/fused_backward.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/cuda_check.hpp"
#include "device/host/driver_api.hpp"
#include "device/kernel/fused_backward_params.hpp"
#include "device/roles/gemm_role.cuh"
#include "mok/error.hpp"
#include "plan/implemented_dtype.hpp"
#include "protocol/counters.hpp"
#include "protocol/world_barrier.hpp"
#include "world/backward_kernel.hpp"
#include "world/backward_layout.hpp"
#include "world/device_scope.hpp"
#include "world/forward_options.hpp"
#include "world/pass_params.hpp"
#include "world/rank_tensors.hpp"
#include "world/fused_kernel.hpp"
#include "world/pass_launch.hpp"
#include "world/pass_report.hpp"
#include "world/trace_memory.hpp"
#include "world/workspace_layout.hpp"
#include "world/world.hpp"
#include "world/world_core.hpp"

namespace mok {
namespace {

using protocol::BackwardPass;
using world::Region;
using world::align_up;

// The tiles of the backward's kinds: A boxes [BM rows][BK] (K-major), MN-major
// boxes [BK rows][64 columns].
using GradCfg = device::PassGemmCfg<BackwardPass>;
constexpr cuuint32_t kBoxK = GradCfg::kBlockK;
constexpr cuuint32_t kBoxRows = GradCfg::kBlockM;
constexpr cuuint32_t kBoxMN = GradCfg::kMNBlock;

CUtensorMap encode(const char* what, const void* base, cuuint32_t rank, std::array<cuuint64_t, 3> dims,
                   std::array<cuuint64_t, 2> strides, std::array<cuuint32_t, 3> box) {
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return device::encode_tensor_map_tiled(what, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, base, dims.data(),
                                         strides.data(), box.data(), element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                         CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// W13 as the gate/up tiles read it (recompute mode): [G][2][N][K], one box of
// [kBlockN / 2 rows][BK] for the gate rows and one for the up rows.
CUtensorMap encode_gate_up(const char* what, const void* base, cuuint64_t K, cuuint64_t N, cuuint64_t groups) {
  const cuuint64_t dims[4] = {K, N, 2, groups};
  const cuuint64_t strides[3] = {K * 2, N * K * 2, 2 * N * K * 2};
  const cuuint32_t box[4] = {kBoxK, static_cast<cuuint32_t>(GradCfg::kBlockN / 2), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  return device::encode_tensor_map_tiled(what, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, base, dims, strides, box,
                                         element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

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

// Every rank's tensor maps, sized for the recompute table, which has the most
// kinds; a pass uploads its own count.
constexpr size_t kMostMaps = device::kBackwardMaps<protocol::BackwardRecomputePass>;
static_assert(kMostMaps >= device::kNumBackwardMaps);
using MapSets = std::vector<std::array<CUtensorMap, kMostMaps>>;

}  // namespace

// Declared in this order on purpose: the world goes before the core whose
// memory it may map.
struct FusedBackward::State {
  world::WorldCore core;  // the ranks' GPUs and workspaces, the report words, the trace, the pass events
  std::unique_ptr<world::World> world;
  LayerConfig config;
  FusedForwardOptions options;
  world::KernelFacts kernel;
  world::PassStateLayout pass_state;
  world::BackwardLayout layout;  // every rank's regions (backward_layout.hpp)
  BackwardMode mode = BackwardMode::kSave;
  // The kernel's parameters in the object's mode (the other stays unused).
  device::FusedBackwardParams params{};
  device::FusedBackwardRecomputeParams recompute_params{};
  // Calls f with the parameters of the object's mode.
  template <class F>
  void with_params(F&& f) {
    if (mode == BackwardMode::kRecompute) {
      f(recompute_params);
    } else {
      f(params);
    }
  }
};

namespace {

// The geometry a rank's counters were sized by, in the table of `Params`.
template <class Params>
const auto& counter_geometry(const world::BackwardRankLayout& g) {
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
// (State: FusedBackward::State, deduced.)
template <class State, class Params>
void bind_counters(State& s, Params& p, uint32_t epoch) {
  const bool ordered = s.core.device_ordered();
  const int set = ordered ? protocol::counter_set_of(epoch) : 0;
  uint32_t* abort = s.core.world_words;
  auto* stall = reinterpret_cast<protocol::StallReport*>(s.core.world_words + 1);
  if (ordered) {
    const world::BackwardRankLayout& g0 = s.layout.ranks[0];
    const auto rank0 = protocol::carve_counters(
        counter_geometry<Params>(g0), reinterpret_cast<uint32_t*>(s.core.rank_base[0] + g0.counters[set].offset));
    abort = rank0.abort;
    stall = rank0.stall;
  }
  for (int r = 0; r < s.config.world_size; ++r) {
    uint8_t* base = s.core.rank_base[static_cast<size_t>(r)];
    if (base == nullptr) continue;
    const world::BackwardRankLayout& g = s.layout.ranks[static_cast<size_t>(r)];
    auto& v = p.ranks[r];
    auto* words = reinterpret_cast<uint32_t*>(base + g.counters[set].offset);
    v.counters = protocol::carve_counters(counter_geometry<Params>(g), words, abort, stall);
    v.combine_next = words + protocol::counter_words(counter_geometry<Params>(g));
    v.idle_counters = reinterpret_cast<uint32_t*>(base + g.counters[1 - set].offset);
  }
  p.epoch = ordered ? epoch : 0;
}


// Rank r's workspace pointers in the table (its base known: owned or
// mapped); in a process world, its inputs too (staged there by each pass,
// where peers read them). Counters are bound per pass (bind_counters).
// (State: FusedBackward::State, deduced.)
template <class State, class Params>
void fill_view(const State& s, Params& p, int r) {
  const world::BackwardRankLayout& g = s.layout.ranks[static_cast<size_t>(r)];
  uint8_t* base = s.core.rank_base[static_cast<size_t>(r)];
  auto& v = p.ranks[r];
  v.dout_rows = reinterpret_cast<uint16_t*>(base + g.dout_rows.offset);
  v.x_rows = reinterpret_cast<uint16_t*>(base + g.x_rows.offset);
  v.w_rows = reinterpret_cast<float*>(base + g.w_rows.offset);
  v.d13_rows = reinterpret_cast<uint16_t*>(base + g.d13_rows.offset);
  v.hw_rows = reinterpret_cast<uint16_t*>(base + g.hw_rows.offset);
  v.dw_parts = reinterpret_cast<float*>(base + g.dw_parts.offset);
  v.combine = reinterpret_cast<uint16_t*>(base + g.combine.offset);
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
world::PassReport device_ordered_report(const State& s) {
  if (s.core.rank_base[0] == nullptr) {
    if (s.core.report_at_close) return *s.core.report_at_close;
    throw Error("FusedBackward::check: rank 0's workspace is not mapped in this process (call import_peers() first)");
  }
  const world::BackwardRankLayout& g0 = s.layout.ranks[0];
  auto* words =
      reinterpret_cast<uint32_t*>(s.core.rank_base[0] + g0.counters[protocol::counter_set_of(s.core.epoch)].offset);
  world::PassReport report;
  const auto read = [&](const auto& p) {
    const auto rank0 = protocol::carve_counters(counter_geometry<std::remove_cvref_t<decltype(p)>>(g0), words);
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
  exchange.mapped = [&s](int q) { s.with_params([&](auto& p) { fill_view(s, p, q); }); };
  exchange.closing = [&s] {
    if (s.core.epoch > 0) s.core.report_at_close = device_ordered_report(s);
  };
  return exchange;
}

}  // namespace

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
      if (core.rank_base[static_cast<size_t>(r)] != nullptr) fill_view(s, p, r);
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

  // The maps of every rank (host only: a failure here enqueues nothing).
  const cuuint64_t H = static_cast<cuuint64_t>(c.hidden), I = static_cast<cuuint64_t>(c.intermediate),
                   S = static_cast<cuuint64_t>(c.shared_width()), El = static_cast<cuuint64_t>(c.experts_per_rank());
  const cuuint64_t P = static_cast<cuuint64_t>(s.layout.buffer_rows);
  const std::array<cuuint32_t, 3> box_a{kBoxK, kBoxRows, 1}, box_mn{kBoxMN, kBoxK, 1};
  // Sized for the recompute table, which has the most kinds; a pass uploads its own count.
  MapSets maps(static_cast<size_t>(served));
  size_t map_count = 0;
  s.with_params([&](auto& params) {
  using Pass = typename std::remove_reference_t<decltype(params)>::Pass;
  map_count = static_cast<size_t>(device::kBackwardMaps<Pass>);
  auto map = [](int kind, int operand) { return static_cast<size_t>(protocol::map_index<Pass>(kind, operand)); };
  for (int r = first; r < first + served; ++r) {
    const BackwardRankTensors& t = ranks[static_cast<size_t>(r - first)];
    const auto& v = params.ranks[r];
    auto& m = maps[static_cast<size_t>(r - first)];
    m = {};
    const cuuint64_t T = static_cast<cuuint64_t>(v.tokens);
    const cuuint64_t T_pad = align_up(T, kBoxRows);
    m[map(Pass::kGrad, 0)] = encode("dout rows", v.dout_rows, 2, {H, P, 1}, {H * 2, 0}, box_a);
    m[map(Pass::kGrad, 1)] = encode("w2 (k-by-n)", t.w2, 3, {I, H, El}, {I * 2, H * I * 2}, box_mn);
    m[map(Pass::kDx, 0)] = encode("d13 rows", v.d13_rows, 2, {2 * I, P, 1}, {4 * I, 0}, box_a);
    m[map(Pass::kDx, 1)] = encode("w13 (k-by-n)", t.w13, 3, {H, 2 * I, El}, {H * 2, 2 * I * H * 2}, box_mn);
    m[map(Pass::kWeightGrad13, 0)] = encode("d13 rows (mn)", v.d13_rows, 2, {2 * I, P, 1}, {4 * I, 0}, box_mn);
    m[map(Pass::kWeightGrad13, 1)] = encode("x rows (mn)", v.x_rows, 2, {H, P, 1}, {H * 2, 0}, box_mn);
    m[map(Pass::kWeightGrad2, 0)] = encode("dout rows (mn)", v.dout_rows, 2, {H, P, 1}, {H * 2, 0}, box_mn);
    m[map(Pass::kWeightGrad2, 1)] = encode("w h rows (mn)", v.hw_rows, 2, {I, P, 1}, {I * 2, 0}, box_mn);
    if (bf16_grads) {  // the weight gradients' tiles, stored by TMA in [16 rows][64 columns] boxes
      const std::array<cuuint32_t, 3> box_out{64, 16, 1};
      auto out_map = [&](protocol::Tensor out) -> CUtensorMap& {
        return m[static_cast<size_t>(protocol::weight_grad_output_map<Pass>(out))];
      };
      out_map(protocol::Tensor::kWeightGrad13) = encode("dw13 (bf16)", t.dw13, 2, {H, El * 2 * I, 1}, {H * 2, 0}, box_out);
      out_map(protocol::Tensor::kWeightGrad2) = encode("dw2 (bf16)", t.dw2, 2, {I, El * H, 1}, {I * 2, 0}, box_out);
      if (S > 0) {
        out_map(protocol::Tensor::kSharedWeightGrad13) =
            encode("dshared_w13 (bf16)", t.dshared_w13, 2, {H, 2 * S, 1}, {H * 2, 0}, box_out);
        out_map(protocol::Tensor::kSharedWeightGrad2) =
            encode("dshared_w2 (bf16)", t.dshared_w2, 2, {S, H, 1}, {S * 2, 0}, box_out);
      }
    }
    if (S > 0 && T > 0) {
      m[map(Pass::kSharedGrad, 0)] = encode("dout", t.dout, 2, {H, T, 1}, {H * 2, 0}, box_a);
      m[map(Pass::kSharedGrad, 1)] =
          encode("shared w2 (k-by-n)", t.shared_w2, 3, {S, H, 1}, {S * 2, H * S * 2}, box_mn);
      m[map(Pass::kSharedDx, 0)] = encode("shared d13", v.shared_d13, 2, {2 * S, T_pad, 1}, {4 * S, 0}, box_a);
      m[map(Pass::kSharedDx, 1)] =
          encode("shared w13 (k-by-n)", t.shared_w13, 3, {H, 2 * S, 1}, {H * 2, 2 * S * H * 2}, box_mn);
      // The shared expert's weight gradients, over the tokens (K): dW13 =
      // shared d13^T x, dW2 = dout^T shared h (a rank without tokens stores
      // zeros and reads nothing).
      m[map(Pass::kSharedWeightGrad13, 0)] =
          encode("shared d13 (mn)", v.shared_d13, 2, {2 * S, T_pad, 1}, {4 * S, 0}, box_mn);
      m[map(Pass::kSharedWeightGrad13, 1)] = encode("x (mn)", t.x, 2, {H, T, 1}, {H * 2, 0}, box_mn);
      m[map(Pass::kSharedWeightGrad2, 0)] = encode("dout (mn)", t.dout, 2, {H, T, 1}, {H * 2, 0}, box_mn);
      m[map(Pass::kSharedWeightGrad2, 1)] =
          encode("shared h (mn)", v.shared_h, 2, {S, T_pad, 1}, {S * 2, 0}, box_mn);
    }
    if constexpr (std::is_same_v<Pass, protocol::BackwardRecomputePass>) {
      // The recomputed gate/up: x rows (and x) against W13 as the forward reads it.
      m[map(Pass::kRecompute, 0)] = encode("x rows", v.x_rows, 2, {H, P, 1}, {H * 2, 0}, box_a);
      m[map(Pass::kRecompute, 1)] = encode_gate_up("w13 (gate/up)", t.w13, H, I, El);
      if (S > 0 && T > 0) {
        m[map(Pass::kSharedRecompute, 0)] = encode("x", t.x, 2, {H, T, 1}, {H * 2, 0}, box_a);
        m[map(Pass::kSharedRecompute, 1)] = encode_gate_up("shared w13 (gate/up)", t.shared_w13, H, S, 1);
      }
    }
  }
  });

  // The pass, after the previous one (which used the same workspaces).
  class BackwardSteps final : public world::PassSteps {
   public:
    BackwardSteps(State& s, std::span<const BackwardRankTensors> ranks, const MapSets& maps, size_t map_count,
                  bool accumulate, bool bf16_grads, bool& numbered, bool& launched)
        : s_(s), ranks_(ranks), maps_(maps), map_count_(map_count), accumulate_(accumulate), bf16_grads_(bf16_grads),
          numbered_(numbered), launched_(launched) {}

    void bind(std::span<const cudaStream_t> streams) override {
      if (s_.core.device_ordered()) {
        ++s_.core.epoch;
        numbered_ = true;
      }
      if (s_.world->stages_inputs()) stage_inputs(streams[0]);
      const int first = s_.core.launches.front().first_rank;
      s_.with_params([&](auto& p) {
        bind_counters(s_, p, s_.core.epoch);
        p.accumulate = accumulate_ ? 1 : 0;
        p.weight_grad_bf16 = bf16_grads_ ? 1 : 0;
        for (int r = first; r < first + static_cast<int>(ranks_.size()); ++r) {
          const BackwardRankTensors& t = ranks_[static_cast<size_t>(r - first)];
          auto& v = p.ranks[r];
          auto* state = static_cast<uint8_t*>(const_cast<void*>(t.pass_state));
          v.expert_rows = reinterpret_cast<int32_t*>(state + s_.pass_state.expert_rows.offset);
          v.rows = reinterpret_cast<RowSource*>(state + s_.pass_state.rows.offset);
          // A process world's rank reads the staged copies (fill_view), as its
          // peers do: the same bytes, and its own tests then cover them.
          if (!s_.world->stages_inputs()) {
            v.expert_offset = reinterpret_cast<int32_t*>(state + s_.pass_state.expert_offset.offset);
            v.x = static_cast<const uint16_t*>(t.x);
            v.dout = static_cast<const uint16_t*>(t.dout);
            v.weights = t.weights;
          }
          // Recompute mode: the pre-activations its own gate/up tasks keep.
          v.preact = v.kept_preact != nullptr ? v.kept_preact : static_cast<const uint16_t*>(t.preact);
          v.shared_preact =
              v.kept_preact != nullptr ? v.kept_shared_preact : static_cast<const uint16_t*>(t.shared_preact);
          v.dx = static_cast<uint16_t*>(t.dx);
          v.dweights = t.dweights;
          v.dw13 = t.dw13;
          v.dw2 = t.dw2;
          v.dshared_w13 = t.dshared_w13;
          v.dshared_w2 = t.dshared_w2;
        }
      });
    }

    // The process world: peers read this rank's x, dout and routing weights
    // (the pull dispatch) and the end of its schedule's expert offsets (the
    // combine) in its workspace: a caller's tensors are not IPC-visible. Safe
    // to overwrite once the previous pass's kernel has ended (the pass waited
    // for it): it ended only after every rank finished that pass (the end
    // barrier).
    void stage_inputs(cudaStream_t stream) {
      const int me = s_.core.process_rank;
      const world::BackwardRankLayout& g = s_.layout.ranks[static_cast<size_t>(me)];
      const BackwardRankTensors& mine = ranks_[0];
      uint8_t* base = s_.core.rank_base[static_cast<size_t>(me)];
      world::DeviceScope on(s_.core.rank_device[static_cast<size_t>(me)]);
      const void* expert_offset = static_cast<const uint8_t*>(mine.pass_state) + s_.pass_state.expert_offset.offset;
      const std::pair<const void*, world::Region> copies[] = {{mine.x, g.staged_x},
                                                              {mine.dout, g.staged_dout},
                                                              {mine.weights, g.staged_weights},
                                                              {expert_offset, g.staged_expert_offset}};
      for (const auto& [from, to] : copies) {
        if (to.bytes > 0) {
          MOK_CUDA_CHECK(cudaMemcpyAsync(base + to.offset, from, to.bytes, cudaMemcpyDeviceToDevice, stream));
        }
      }
    }

    // Its ranks' maps; host-ordered, their counter sets (the combine's
    // cursor with them) and the world's report words; the trace counts. The
    // first launch's GPU is the report GPU (rank 0's, or a process world's own).
    void prepare(size_t i, cudaStream_t stream) override {
      const world::Launch& launch = s_.core.launches[i];
      const int first = s_.core.launches.front().first_rank;
      const bool ordered = s_.core.device_ordered();
      for (int r = launch.first_rank; r < launch.first_rank + launch.ranks; ++r) {
        const world::BackwardRankLayout& g = s_.layout.ranks[static_cast<size_t>(r)];
        uint8_t* base = s_.core.rank_base[static_cast<size_t>(r)];
        MOK_CUDA_CHECK(cudaMemcpyAsync(base + g.maps.offset, maps_[static_cast<size_t>(r - first)].data(),
                                       sizeof(CUtensorMap) * map_count_, cudaMemcpyHostToDevice, stream));
        if (!ordered) MOK_CUDA_CHECK(cudaMemsetAsync(base + g.counters[0].offset, 0, g.counters[0].bytes, stream));
      }
      if (i == 0) {
        if (!ordered) s_.core.zero_report_words(stream);
        if (s_.core.trace_memory != nullptr) {
          MOK_CUDA_CHECK(cudaMemsetAsync(s_.core.trace_memory, 0, s_.core.trace_count_bytes(), stream));
        }
      }
    }

    void launch(size_t i, cudaStream_t stream) override {
      const world::Launch& launch = s_.core.launches[i];
      s_.with_params([&](auto& p) {
        auto mine = p;
        mine.first_rank = launch.first_rank;
        mine.launch_ranks = launch.ranks;
        launched_ = true;  // from here a failure may leave some launch enqueued
        world::launch_backward_kernel(mine, launch.ranks * s_.options.ctas_per_rank, stream,
                                      s_.core.system_scope());
      });
    }

   private:
    State& s_;
    std::span<const BackwardRankTensors> ranks_;
    const MapSets& maps_;
    const size_t map_count_;
    const bool accumulate_, bf16_grads_;
    bool& numbered_;
    bool& launched_;
  };
  bool numbered = false;  // device-ordered: this pass took a number
  bool launched = false;  // some launch of this pass is enqueued
  try {
    BackwardSteps steps(s, ranks, maps, map_count, accumulate, bf16_grads, numbered, launched);
    world::enqueue_pass(s.core, *s.world, steps, cuda_streams, /*capturing=*/false);
  } catch (...) {
    world::give_back_number(s.core, numbered, launched);
    throw;
  }
}

void FusedBackward::check(CUstream_st* stream) {
  if (state_->core.kind == world::WorldKind::kPeer) {
    const std::vector<CUstream_st*> streams(state_->core.launches.size(), nullptr);
    check(streams);
    return;
  }
  check(std::span<CUstream_st* const>(&stream, 1));
}

void FusedBackward::check(std::span<CUstream_st* const> streams) {
  State& s = *state_;
  world::wait_for_last_pass(s.core, std::vector<cudaStream_t>(streams.begin(), streams.end()));
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
    report = device_ordered_report(s);
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

std::vector<uint8_t> FusedBackward::export_handle() const {
  return state_->world->export_handle(state_->core, backward_exchange(*state_));
}

void FusedBackward::import_peers(std::span<const std::vector<uint8_t>> handles) {
  State& s = *state_;
  s.world->import_peers(s.core, backward_exchange(s), handles);
  s.core.report_at_close.reset();
}

void FusedBackward::close_peers() { state_->world->close_peers(state_->core, backward_exchange(*state_)); }

std::vector<TraceEvent> FusedBackward::trace(CUstream_st* stream) {
  State& s = *state_;
  if (s.core.trace_memory == nullptr) throw Error("FusedBackward::trace: tracing is off (options.trace_events = 0)");
  check(stream);
  return s.core.read_trace("FusedBackward::trace", s.options.trace_events);
}

}  // namespace mok
