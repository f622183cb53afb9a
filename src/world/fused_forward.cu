// Host side of the fused forward in the virtual world: validation, every
// rank's workspace (one allocation per rank), the world's pointer table and
// tensor maps, the launch, and the translation of a stall report into an
// error. The world seam is the FusedForwardParams table: a real multi-GPU
// world fills the same table with peer pointers.
#include "mok/fused_forward.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <cstdio>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "device/host/driver_api.hpp"
#include "device/kernel/fused_forward_kernel.cuh"
#include "mok/error.hpp"
#include "protocol/counters.hpp"

namespace mok {
namespace {

using device::FusedForwardParams;
using device::RankView;

constexpr int kTileM = 128;

size_t align_up(size_t value, size_t alignment) { return (value + alignment - 1) / alignment * alignment; }

// Carves typed regions out of one allocation, 1 KB aligned each.
struct Carver {
  size_t offset = 0;
  template <class T>
  size_t take(size_t count) {
    const size_t at = align_up(offset, 1024);
    offset = at + count * sizeof(T);
    return at;
  }
};

struct RankLayout {
  size_t ring_x, ring_h, combine, shared_h, shared_out, expert_rows, expert_offset, rows, schedule_hist, counters,
      maps;
  size_t bytes;
  protocol::ForwardGeometry geometry;  // padded_rows unknown (0): sizes only
  int64_t row_capacity;
};

CUtensorMap encode(const char* what, const void* base, int rank, std::array<cuuint64_t, 4> dims,
                   std::array<cuuint64_t, 3> strides, std::array<cuuint32_t, 4> box) {
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  return device::encode_tensor_map_tiled(what, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, static_cast<cuuint32_t>(rank),
                                         base, dims.data(), strides.data(), box.data(), element_strides,
                                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// Messages here are built with std::to_string / snprintf, not iostreams: this
// code also runs inside the PyTorch extension, where formatting an integer
// through an ostream crashed (a libstdc++ mismatch in torch 2.11's process;
// docs/perf-notes.md, "torch extension").
std::string pointer_text(const void* p) {
  char text[32];
  std::snprintf(text, sizeof(text), "%p", p);
  return text;
}

void require_device_pointer(const void* p, const std::string& field, bool required) {
  if (p == nullptr) {
    if (required) throw Error(field + " is null");
    return;
  }
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    throw Error(field + " = " + pointer_text(p) + ": must be 16-byte aligned");
  }
}

// Makes `device` current for a scope, then restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    MOK_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) MOK_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

template <cuda::thread_scope kScope>
void launch_fused(const FusedForwardParams& params, int ctas, cudaStream_t stream) {
  // A cooperative launch: it fails cleanly instead of starting when the grid
  // cannot be resident all at once (other work on the GPU, MPS limits), which
  // the protocol's progress argument needs (docs/protocol.md).
  cudaLaunchConfig_t launch{};
  launch.gridDim = dim3(static_cast<unsigned>(ctas));
  launch.blockDim = dim3(device::kFusedThreads);
  launch.dynamicSmemBytes = static_cast<size_t>(device::fused_smem_bytes());
  launch.stream = stream;
  cudaLaunchAttribute cooperative{};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  launch.attrs = &cooperative;
  launch.numAttrs = 1;
  MOK_CUDA_CHECK(cudaLaunchKernelEx(&launch, device::fused_forward_kernel<kScope>, params));
}

}  // namespace

std::string FusedForwardOptions::describe() const {
  std::string world = "virtual";
  if (!devices.empty()) {
    world = "peer (GPUs";
    for (int d : devices) world += " " + std::to_string(d);
    world += ")";
  }
  return "world=" + world + " minibatch_rows=" + std::to_string(minibatch_rows) +
         " ring_slots=" + std::to_string(ring_slots) + " lookahead=" + std::to_string(lookahead) +
         " ctas_per_rank=" + std::to_string(ctas_per_rank) +
         " comm_ctas_per_rank=" + std::to_string(comm_ctas_per_rank) +
         " timeout=" + std::to_string(timeout_seconds) + "s";
}

struct FusedForward::State {
  LayerConfig config;
  FusedForwardOptions options;
  bool peer_world = false;
  std::vector<int> rank_device;  // GPU of each rank's workspace
  std::vector<RankLayout> layouts;
  std::vector<uint8_t*> rank_memory;
  uint32_t* world_words = nullptr;  // on rank 0's GPU: [0] abort, [1..] StallReport
  uint8_t* trace_memory = nullptr;  // on rank 0's GPU: the event count, then the events
  FusedForwardParams params{};
  std::vector<RankTensors> last_tensors;  // tensor maps were built for these
  // Peer world: per rank, "everything before this pass is done" and
  // "this rank's counters are zeroed" (orders the GPUs without the host).
  std::vector<cudaEvent_t> ready, zeroed;

  ~State() {
    for (size_t r = 0; r < rank_memory.size(); ++r) {
      if (rank_memory[r] != nullptr) {
        cudaSetDevice(rank_device[r]);
        cudaFree(rank_memory[r]);
      }
    }
    for (cudaEvent_t e : ready) cudaEventDestroy(e);
    for (cudaEvent_t e : zeroed) cudaEventDestroy(e);
    if (world_words != nullptr) {
      cudaSetDevice(rank_device[0]);
      cudaFree(world_words);
    }
    if (trace_memory != nullptr) {
      cudaSetDevice(rank_device[0]);
      cudaFree(trace_memory);
    }
  }

  void upload_maps(std::span<const RankTensors> ranks, int r, cudaStream_t stream);
  void zero_counters(int r, cudaStream_t stream);
};

FusedForward::FusedForward(const LayerConfig& config, const FusedForwardOptions& options)
    : state_(std::make_unique<State>()) {
  validate(config);
  State& s = *state_;
  s.config = config;
  s.options = options;
  FusedForwardOptions& o = s.options;

  require(config.dtype == DType::kBF16, "dtype", static_cast<int>(config.dtype),
          "the fused forward supports bf16 only (fp8 is not implemented yet)");
  require(config.top_k <= device::kMaxTopK, "top_k", config.top_k, "the fused forward supports top_k <= 16");
  require(config.hidden * 2 <= static_cast<int>(device::kCopySlotBytes), "hidden", config.hidden,
          "the fused forward supports hidden <= 8192");
  require(config.experts_per_rank() <= device::kMaxScheduleExperts, "num_experts / world_size",
          config.experts_per_rank(), "the fused forward supports at most 1024 experts per rank");
  require(o.minibatch_rows >= kTileM && o.minibatch_rows % kTileM == 0, "minibatch_rows", o.minibatch_rows,
          "must be a positive multiple of 128 (the GEMM tile height)");
  require(o.ring_slots >= 1, "ring_slots", o.ring_slots, "must be >= 1");
  require(o.lookahead >= 1, "lookahead", o.lookahead, "must be >= 1");
  // Above 8 s the kernel's 10 s mbarrier trap (ptx/async_copy.cuh) could fire
  // before a protocol wait reports its stall.
  require(o.timeout_seconds > 0 && o.timeout_seconds <= 8, "timeout_seconds", o.timeout_seconds,
          "must be in (0, 8]");
  require(o.trace_events >= 0, "trace_events", o.trace_events, "must be >= 0 (0: no trace)");

  const int R = config.world_size;
  s.peer_world = !o.devices.empty();
  int current = 0;
  MOK_CUDA_CHECK(cudaGetDevice(&current));
  if (s.peer_world) {
    require(static_cast<int>(o.devices.size()) == R, "devices.size()", o.devices.size(),
            "must equal world_size (one GPU per rank), or be empty for the virtual world");
    int count = 0;
    MOK_CUDA_CHECK(cudaGetDeviceCount(&count));
    for (int r = 0; r < R; ++r) {
      require(o.devices[r] >= 0 && o.devices[r] < count, ("devices[" + std::to_string(r) + "]").c_str(),
              o.devices[r], ("must name one of the " + std::to_string(count) + " visible GPUs").c_str());
      for (int q = 0; q < r; ++q) {
        require(o.devices[q] != o.devices[r], ("devices[" + std::to_string(r) + "]").c_str(), o.devices[r],
                "must differ from every other rank's GPU (one rank per GPU)");
      }
    }
    s.rank_device = o.devices;
  } else {
    s.rank_device.assign(R, current);
  }
  // SMs per rank: a partition of one GPU (virtual) or a whole GPU (peer).
  int sms = 1 << 30;
  for (int r = 0; r < R; ++r) {
    int device_sms = 0;
    MOK_CUDA_CHECK(cudaDeviceGetAttribute(&device_sms, cudaDevAttrMultiProcessorCount, s.rank_device[r]));
    sms = std::min(sms, device_sms);
  }
  const int ranks_per_gpu = s.peer_world ? 1 : R;
  if (o.ctas_per_rank == 0) o.ctas_per_rank = sms / ranks_per_gpu;
  if (o.comm_ctas_per_rank == 0) o.comm_ctas_per_rank = std::max(1, o.ctas_per_rank / 12);
  require(o.ctas_per_rank * ranks_per_gpu <= sms, "ctas_per_rank", o.ctas_per_rank,
          ("times the ranks per GPU must not exceed the " + std::to_string(sms) +
           " SMs: every CTA must be resident at once").c_str());
  require(o.comm_ctas_per_rank >= 1 && o.comm_ctas_per_rank < o.ctas_per_rank, "comm_ctas_per_rank",
          o.comm_ctas_per_rank, "must be >= 1 and leave at least one GEMM CTA per rank");

  const int H = config.hidden, I = config.intermediate, S = config.shared_width(), k = config.top_k;
  const int El = config.experts_per_rank();
  const int64_t ring_rows = static_cast<int64_t>(o.ring_slots) * o.minibatch_rows;
  // Worst case of one rank's schedule: every (token, slot) entry of the world
  // on its experts -- an upper bound even for invalid routing (repeated ids on
  // another rank are caught by that rank, but this rank has already counted
  // them), so the schedule can never run past its buffer.
  const int64_t row_capacity = config.total_tokens() * k + static_cast<int64_t>(El) * (kTileM - 1);

  s.layouts.resize(R);
  s.rank_memory.assign(R, nullptr);
  {
    DeviceScope on(s.rank_device[0]);
    MOK_CUDA_CHECK(cudaMalloc(&s.world_words, 64));
    if (o.trace_events > 0) {
      MOK_CUDA_CHECK(cudaMalloc(&s.trace_memory, 256 + static_cast<size_t>(o.trace_events) * sizeof(TraceEvent)));
    }
  }
  if (s.peer_world) {
    // Every GPU reads and writes every other's buffers: peer access both ways.
    // (Never NVLink multicast: it can take a shared host's GPUs out of service.)
    for (int a : s.rank_device) {
      DeviceScope on(a);
      for (int b : s.rank_device) {
        if (a == b) continue;
        int can = 0;
        MOK_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
        if (!can) {
          throw Error("peer world: GPU " + std::to_string(a) + " cannot access GPU " + std::to_string(b) +
                      "'s memory (no peer access); every pair of its GPUs needs NVLink or PCIe P2P");
        }
        const cudaError_t status = cudaDeviceEnablePeerAccess(b, 0);
        if (status == cudaErrorPeerAccessAlreadyEnabled) {
          cudaGetLastError();  // fine: someone enabled it before us
        } else {
          MOK_CUDA_CHECK(status);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    RankLayout& L = s.layouts[r];
    const int64_t T = config.tokens_per_rank[r];
    protocol::ForwardGeometry& g = L.geometry;
    g = {};
    g.tile_m = kTileM;
    g.minibatch_rows = o.minibatch_rows;
    g.ring_slots = o.ring_slots;
    g.shared_m_tiles = S > 0 ? static_cast<int32_t>((T + kTileM - 1) / kTileM) : 0;
    L.row_capacity = row_capacity;
    Carver c;
    L.ring_x = c.take<uint16_t>(static_cast<size_t>(ring_rows) * H);
    L.ring_h = c.take<uint16_t>(static_cast<size_t>(ring_rows) * I);
    L.combine = c.take<uint16_t>(static_cast<size_t>(T) * k * H);
    L.shared_h = c.take<uint16_t>(static_cast<size_t>(align_up(static_cast<size_t>(T), kTileM)) * S);
    L.shared_out = c.take<uint16_t>(static_cast<size_t>(T) * H);
    L.expert_rows = c.take<int32_t>(El);
    L.expert_offset = c.take<int32_t>(El + 1);
    L.rows = c.take<RowSource>(static_cast<size_t>(row_capacity));
    L.schedule_hist = c.take<int32_t>(static_cast<size_t>(o.comm_ctas_per_rank) * device::kScheduleWarpsPerCta * El);
    L.counters = c.take<uint32_t>(protocol::counter_words(g));
    L.maps = c.take<CUtensorMap>(device::kNumMaps);
    L.bytes = align_up(c.offset, 1024);
    DeviceScope on(s.rank_device[r]);
    MOK_CUDA_CHECK(cudaMalloc(&s.rank_memory[r], L.bytes));
    if (s.peer_world) {
      cudaEvent_t e;
      MOK_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      s.ready.push_back(e);
      MOK_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      s.zeroed.push_back(e);
    }
  }

  FusedForwardParams& p = s.params;
  p.world_size = R;
  p.first_rank = 0;
  p.launch_ranks = R;
  p.hidden = H;
  p.intermediate = I;
  p.shared_width = S;
  p.top_k = k;
  p.num_local_experts = El;
  p.tile_m = kTileM;
  p.minibatch_rows = o.minibatch_rows;
  p.ring_slots = o.ring_slots;
  p.lookahead = o.lookahead;
  p.ctas_per_rank = o.ctas_per_rank;
  p.comm_ctas_per_rank = o.comm_ctas_per_rank;
  p.timeout_ns = static_cast<uint64_t>(o.timeout_seconds * 1e9);
  if (s.trace_memory != nullptr) {
    p.trace_count = reinterpret_cast<uint32_t*>(s.trace_memory);
    p.trace = reinterpret_cast<TraceEvent*>(s.trace_memory + 256);
    p.trace_capacity = static_cast<uint32_t>(o.trace_events);
  }
  auto* abort = s.world_words;
  auto* stall = reinterpret_cast<protocol::StallReport*>(s.world_words + 1);
  for (int r = 0; r < R; ++r) {
    const RankLayout& L = s.layouts[r];
    uint8_t* base = s.rank_memory[r];
    RankView& v = p.ranks[r];
    v.tokens = config.tokens_per_rank[r];
    v.ring_x = reinterpret_cast<uint16_t*>(base + L.ring_x);
    v.ring_h = reinterpret_cast<uint16_t*>(base + L.ring_h);
    v.combine = reinterpret_cast<uint16_t*>(base + L.combine);
    v.shared_h = reinterpret_cast<uint16_t*>(base + L.shared_h);
    v.shared_out = reinterpret_cast<uint16_t*>(base + L.shared_out);
    v.expert_rows = reinterpret_cast<int32_t*>(base + L.expert_rows);
    v.expert_offset = reinterpret_cast<int32_t*>(base + L.expert_offset);
    v.rows = reinterpret_cast<RowSource*>(base + L.rows);
    v.schedule_hist = reinterpret_cast<int32_t*>(base + L.schedule_hist);
    v.counters = protocol::carve_counters(L.geometry, reinterpret_cast<uint32_t*>(base + L.counters), abort, stall);
    v.maps = reinterpret_cast<const CUtensorMap*>(base + L.maps);
  }
  for (int r = 0; r < (s.peer_world ? R : 1); ++r) {
    DeviceScope on(s.rank_device[r]);
    if (s.peer_world) {
      MOK_CUDA_CHECK(cudaFuncSetAttribute(device::fused_forward_kernel<cuda::thread_scope_system>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, device::fused_smem_bytes()));
    } else {
      MOK_CUDA_CHECK(cudaFuncSetAttribute(device::fused_forward_kernel<cuda::thread_scope_device>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, device::fused_smem_bytes()));
    }
  }
}

FusedForward::~FusedForward() = default;

const LayerConfig& FusedForward::config() const { return state_->config; }
const FusedForwardOptions& FusedForward::options() const { return state_->options; }

void FusedForward::State::upload_maps(std::span<const RankTensors> ranks, int r, cudaStream_t stream) {
  const LayerConfig& c = config;
  const int H = c.hidden, I = c.intermediate, S = c.shared_width(), El = c.experts_per_rank();
  const int64_t ring_rows = static_cast<int64_t>(options.ring_slots) * options.minibatch_rows;
  const cuuint64_t h2 = static_cast<cuuint64_t>(H) * 2, i2 = static_cast<cuuint64_t>(I) * 2,
                   s2 = static_cast<cuuint64_t>(S) * 2;
  const RankView& v = params.ranks[r];
  const RankTensors& t = ranks[r];
  const cuuint64_t T = static_cast<cuuint64_t>(c.tokens_per_rank[r]);
  const cuuint64_t T_pad = align_up(T, kTileM);
  std::array<CUtensorMap, device::kNumMaps> maps{};
  maps[device::kMapRingX] = encode("ring x", v.ring_x, 2, {cuuint64_t(H), cuuint64_t(ring_rows), 1, 1}, {h2, 0, 0}, {64, 128, 1, 1});
  maps[device::kMapW13] = encode("w13", t.w13, 4, {cuuint64_t(H), cuuint64_t(I), 2, cuuint64_t(El)},
                                 {h2, h2 * I, 2 * h2 * I}, {64, 128, 1, 1});
  maps[device::kMapRingH] = encode("ring h", v.ring_h, 2, {cuuint64_t(I), cuuint64_t(ring_rows), 1, 1}, {i2, 0, 0}, {64, 128, 1, 1});
  maps[device::kMapW2] = encode("w2", t.w2, 3, {cuuint64_t(I), cuuint64_t(H), cuuint64_t(El), 1}, {i2, i2 * H, 0}, {64, 256, 1, 1});
  if (T > 0) {
    maps[device::kMapX] = encode("x", t.x, 2, {cuuint64_t(H), T, 1, 1}, {h2, 0, 0}, {64, 128, 1, 1});
  }
  if (S > 0 && T > 0) {
    maps[device::kMapSharedW13] = encode("shared w13", t.shared_w13, 4, {cuuint64_t(H), cuuint64_t(S), 2, 1},
                                         {h2, h2 * S, 2 * h2 * S}, {64, 128, 1, 1});
    maps[device::kMapSharedH] = encode("shared h", v.shared_h, 2, {cuuint64_t(S), T_pad, 1, 1}, {s2, 0, 0}, {64, 128, 1, 1});
    maps[device::kMapSharedW2] = encode("shared w2", t.shared_w2, 3, {cuuint64_t(S), cuuint64_t(H), 1, 1},
                                        {s2, s2 * H, 0}, {64, 256, 1, 1});
  }
  // Ordered on the pass's stream, so a pass still running keeps its maps; a
  // pageable source is staged before the call returns.
  MOK_CUDA_CHECK(cudaMemcpyAsync(const_cast<CUtensorMap*>(v.maps), maps.data(), sizeof(maps),
                                 cudaMemcpyHostToDevice, stream));
}

// Counters start at zero every pass (a few KB per rank); rank 0 also clears
// the world's abort flag and stall report.
void FusedForward::State::zero_counters(int r, cudaStream_t stream) {
  if (r == 0) MOK_CUDA_CHECK(cudaMemsetAsync(world_words, 0, 64, stream));
  const RankLayout& L = layouts[r];
  MOK_CUDA_CHECK(cudaMemsetAsync(rank_memory[r] + L.counters, 0,
                                 protocol::counter_words(L.geometry) * sizeof(uint32_t), stream));
}

void FusedForward::run(std::span<const RankTensors> ranks, CUstream_st* stream) {
  if (state_->peer_world) {
    const std::vector<CUstream_st*> streams(state_->rank_device.size(), nullptr);
    run(ranks, streams);
    return;
  }
  run(ranks, std::span<CUstream_st* const>(&stream, 1));
}

void FusedForward::run(std::span<const RankTensors> ranks, std::span<CUstream_st* const> streams) {
  State& s = *state_;
  const LayerConfig& c = s.config;
  const int R = c.world_size;
  if (static_cast<int>(ranks.size()) != R) {
    throw Error("run: got tensors for " + std::to_string(ranks.size()) + " ranks; world_size is " + std::to_string(R));
  }
  const size_t expected_streams = s.peer_world ? static_cast<size_t>(R) : 1;
  if (streams.size() != expected_streams) {
    throw Error("run: got " + std::to_string(streams.size()) + " streams; this " +
                (s.peer_world ? "peer world needs one per rank (" : "virtual world needs one (") +
                std::to_string(expected_streams) + ")");
  }
  const int S = c.shared_width();
  bool maps_changed = s.last_tensors.size() != ranks.size();
  for (int r = 0; r < R; ++r) {
    const RankTensors& t = ranks[r];
    const bool has_tokens = c.tokens_per_rank[r] > 0;
    const std::string rank = "rank " + std::to_string(r) + ": ";
    require_device_pointer(t.x, rank + "x", has_tokens);
    require_device_pointer(t.out, rank + "out", has_tokens);
    require_device_pointer(t.w13, rank + "w13", true);
    require_device_pointer(t.w2, rank + "w2", true);
    require_device_pointer(t.shared_w13, rank + "shared_w13", S > 0);
    require_device_pointer(t.shared_w2, rank + "shared_w2", S > 0);
    if (has_tokens && (t.expert_ids == nullptr || t.weights == nullptr)) {
      throw Error(rank + "expert_ids and weights must not be null");
    }
    if (!maps_changed) {
      const RankTensors& old = s.last_tensors[r];
      maps_changed = old.x != t.x || old.w13 != t.w13 || old.w2 != t.w2 || old.shared_w13 != t.shared_w13 ||
                     old.shared_w2 != t.shared_w2;
    }
  }

  FusedForwardParams& p = s.params;
  for (int r = 0; r < R; ++r) {
    RankView& v = p.ranks[r];
    v.x = static_cast<const uint16_t*>(ranks[r].x);
    v.ids = ranks[r].expert_ids;
    v.weights = ranks[r].weights;
    v.out = static_cast<uint16_t*>(ranks[r].out);
  }

  if (!s.peer_world) {
    cudaStream_t st = reinterpret_cast<cudaStream_t>(streams[0]);
    // Tensor maps change only when a tensor moves; steady-state runs skip them.
    if (maps_changed) {
      for (int r = 0; r < R; ++r) s.upload_maps(ranks, r, st);
    }
    for (int r = 0; r < R; ++r) s.zero_counters(r, st);
    if (s.trace_memory != nullptr) MOK_CUDA_CHECK(cudaMemsetAsync(s.trace_memory, 0, sizeof(uint32_t), st));
    launch_fused<cuda::thread_scope_device>(p, R * s.options.ctas_per_rank, st);
  } else {
    auto stream_of = [&](int r) { return reinterpret_cast<cudaStream_t>(streams[r]); };
    // 1. Each GPU marks the end of everything enqueued before this pass (the
    //    previous pass, the producers of this pass's inputs).
    for (int r = 0; r < R; ++r) {
      DeviceScope on(s.rank_device[r]);
      MOK_CUDA_CHECK(cudaEventRecord(s.ready[r], stream_of(r)));
    }
    // 2. Once every GPU got there (nobody still reads our counters or writes
    //    our combine rows), zero our counters (and refresh our tensor maps).
    for (int r = 0; r < R; ++r) {
      DeviceScope on(s.rank_device[r]);
      for (int q = 0; q < R; ++q) {
        if (q != r) MOK_CUDA_CHECK(cudaStreamWaitEvent(stream_of(r), s.ready[q], 0));
      }
      if (maps_changed) s.upload_maps(ranks, r, stream_of(r));
      s.zero_counters(r, stream_of(r));
      if (r == 0 && s.trace_memory != nullptr) {
        MOK_CUDA_CHECK(cudaMemsetAsync(s.trace_memory, 0, sizeof(uint32_t), stream_of(r)));
      }
      MOK_CUDA_CHECK(cudaEventRecord(s.zeroed[r], stream_of(r)));
    }
    // 3. Once every GPU's counters are zero, every GPU starts its rank.
    for (int r = 0; r < R; ++r) {
      DeviceScope on(s.rank_device[r]);
      for (int q = 0; q < R; ++q) {
        if (q != r) MOK_CUDA_CHECK(cudaStreamWaitEvent(stream_of(r), s.zeroed[q], 0));
      }
      FusedForwardParams mine = p;
      mine.first_rank = r;
      mine.launch_ranks = 1;
      launch_fused<cuda::thread_scope_system>(mine, s.options.ctas_per_rank, stream_of(r));
    }
  }
  if (maps_changed) s.last_tensors.assign(ranks.begin(), ranks.end());
}

void FusedForward::check(std::span<CUstream_st* const> streams) {
  State& s = *state_;
  for (size_t i = 0; i < streams.size(); ++i) {
    DeviceScope on(s.rank_device[s.peer_world ? i : 0]);
    MOK_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(streams[i])));
  }
  check_report();
}

void FusedForward::check(CUstream_st* stream) {
  if (state_->peer_world) {
    const std::vector<CUstream_st*> streams(state_->rank_device.size(), nullptr);
    check(streams);
    return;
  }
  check(std::span<CUstream_st* const>(&stream, 1));
}

void FusedForward::check_report() {
  State& s = *state_;
  uint32_t words[1 + sizeof(protocol::StallReport) / 4];
  {
    DeviceScope on(s.rank_device[0]);
    MOK_CUDA_CHECK(cudaMemcpy(words, s.world_words, sizeof(words), cudaMemcpyDeviceToHost));
  }
  if (words[0] == 0) return;
  protocol::StallReport report;
  std::memcpy(&report, words + 1, sizeof(report));
  const auto id = static_cast<protocol::CounterId>(report.counter);
  using std::to_string;
  if (id == protocol::CounterId::kBadRouting) {
    const int k = s.config.top_k;
    throw Error("fused forward: rank " + to_string(report.waiter) + ", token " + to_string(report.index / k) +
                ", slot " + to_string(report.index % k) + ": expert id " +
                to_string(static_cast<int32_t>(report.observed)) + " is out of range [0, " +
                to_string(s.config.num_experts) + ") or repeats an earlier slot of the token");
  }
  throw Error("fused forward stalled: rank " + to_string(report.waiter) + " waited on " +
              protocol::counter_name(id) + "[" + to_string(report.index) + "] of rank " + to_string(report.owner) +
              " for >= " + to_string(report.target) + " but saw " + to_string(report.observed) + " after " +
              to_string(s.options.timeout_seconds) + " s (" + s.options.describe() + ")");
}

std::vector<TraceEvent> FusedForward::trace(CUstream_st* stream) {
  State& s = *state_;
  if (s.trace_memory == nullptr) throw Error("trace: tracing is off (set FusedForwardOptions::trace_events)");
  check(stream);
  DeviceScope on(s.rank_device[0]);
  uint32_t count = 0;
  MOK_CUDA_CHECK(cudaMemcpy(&count, s.trace_memory, sizeof(count), cudaMemcpyDeviceToHost));
  if (count > static_cast<uint32_t>(s.options.trace_events)) {
    throw Error("trace: the pass recorded " + std::to_string(count) + " events, more than trace_events = " +
                std::to_string(s.options.trace_events) + "; raise it");
  }
  std::vector<TraceEvent> events(count);
  if (count > 0) {
    MOK_CUDA_CHECK(cudaMemcpy(events.data(), s.trace_memory + 256, count * sizeof(TraceEvent),
                              cudaMemcpyDeviceToHost));
  }
  return events;
}

}  // namespace mok
