// Host side of the fused forward in every world: validation, the ranks'
// workspaces (one allocation per rank; a process world allocates its own and
// maps its peers' through CUDA IPC), the world's pointer table and tensor
// maps, the launches (host-ordered: zero counters first; device-ordered: pass
// an epoch, src/protocol/world_barrier.hpp), and the translation of a stall
// report into an error. The world seam is the FusedForwardParams table.
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
#include "plan/sm_split.hpp"
#include "protocol/pass_forward.hpp"
#include "protocol/world_barrier.hpp"
#include "world/world_handle.hpp"

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
  size_t ring_x, ring_h, combine, shared_h, shared_out, expert_rows, expert_offset, rows, schedule_hist, maps;
  size_t counters[2];  // two counter sets: set 0 only when host-ordered, epoch % 2 when device-ordered
  size_t barrier;      // protocol::WorldBarrierWords
  size_t staged_x, staged_ids;  // process world: this rank's inputs, where its peers can read them
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
  if (process_rank >= 0) {
    world = "process (rank " + std::to_string(process_rank) + ")";
  } else if (!devices.empty()) {
    world = "peer (GPUs";
    for (int d : devices) world += " " + std::to_string(d);
    world += ")";
  }
  const bool ordered = device_ordered || process_rank >= 0;
  return "world=" + world + (ordered ? " device_ordered" : "") + " minibatch_rows=" + std::to_string(minibatch_rows) +
         " ring_slots=" + std::to_string(ring_slots) + " lookahead=" + std::to_string(lookahead) +
         " ctas_per_rank=" + std::to_string(ctas_per_rank) +
         " comm_ctas_per_rank=" + std::to_string(comm_ctas_per_rank) +
         " timeout=" + std::to_string(timeout_seconds) + "s";
}

struct FusedForward::State {
  LayerConfig config;
  FusedForwardOptions options;
  bool peer_world = false;
  bool process_world = false;
  bool device_ordered = false;
  int me = -1;                   // process world: this process's rank
  std::vector<int> rank_device;  // GPU of each rank's workspace (process world: this GPU for all)
  std::vector<RankLayout> layouts;
  std::vector<uint8_t*> rank_memory;  // allocations this object owns (process world: its own rank's only)
  std::vector<uint8_t*> rank_base;    // every rank's workspace as this process sees it (null: not mapped yet)
  std::vector<int> ipc_mapped;        // ranks whose workspace is an IPC mapping (closed, not freed)
  bool imported = false;
  uint32_t* world_words = nullptr;  // host-ordered: on rank 0's GPU: [0] abort, [1..] StallReport
  uint32_t epoch = 0;               // device-ordered: the last pass enqueued (0: none yet)
  bool broken = false;              // a barrier wait gave up: no further pass can be ordered
  uint8_t* trace_memory = nullptr;  // per world block: its event count; then its events (on rank 0's GPU)
  size_t trace_blocks = 0, trace_per_block = 0;
  FusedForwardParams params{};
  std::vector<RankTensors> last_tensors;  // tensor maps were built for these
  // Peer world: per rank, "everything before this pass is done" and
  // "this rank's counters are zeroed" (orders the GPUs without the host).
  std::vector<cudaEvent_t> ready, zeroed;
  // Device-ordered: per launch, the end of the last pass enqueued; the next
  // pass's stream waits for it (a pass must follow the previous one even when
  // the caller switches streams).
  std::vector<cudaEvent_t> pass_done;
  std::vector<bool> pass_done_recorded;

  ~State() {
    // A pass still running would touch the peers' memory: let it end first.
    if (!ipc_mapped.empty()) {
      cudaSetDevice(rank_device[me]);
      cudaDeviceSynchronize();
    }
    close_mappings();
    for (size_t i = 0; i < pass_done.size(); ++i) cudaEventDestroy(pass_done[i]);
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

  void close_mappings() {
    for (int q : ipc_mapped) {
      cudaIpcCloseMemHandle(rank_base[q]);
      rank_base[q] = nullptr;
    }
    ipc_mapped.clear();
    imported = false;
  }

  // The GPU the host reads the pass's reports on (rank 0's, or ours in a process world).
  int report_device() const { return process_world ? rank_device[me] : rank_device[0]; }
  size_t trace_count_bytes() const { return align_up(trace_blocks * sizeof(uint32_t), 256); }
  void follow_last_pass(int launch, int device, cudaStream_t stream);
  void fill_view(int r);
  void bind_counters(uint32_t pass_epoch);
  void upload_maps(const RankTensors& t, int r, cudaStream_t stream);
  void zero_counters(int r, cudaStream_t stream);
  void check_tensors(const RankTensors& t, int r) const;
  void check_barrier_reports();
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
  require(o.trace_events == 0 || (!o.device_ordered && o.process_rank < 0), "trace_events", o.trace_events,
          "tracing is supported in host-ordered worlds only (not with device_ordered or a process world)");
  // Barrier waits hold no mbarrier (nothing else of the CTA waits on one
  // meanwhile), so they may wait longer than the protocol's bound.
  require(o.barrier_timeout_seconds > 0 && o.barrier_timeout_seconds <= 3600, "barrier_timeout_seconds",
          o.barrier_timeout_seconds, "must be in (0, 3600]");

  const int R = config.world_size;
  if (o.device_ordered || o.process_rank >= 0) {
    // An aborting peer may take up to timeout_seconds to reach the end of its
    // pass; a shorter barrier bound would break the world on a mere stall.
    require(o.barrier_timeout_seconds > o.timeout_seconds, "barrier_timeout_seconds", o.barrier_timeout_seconds,
            "must exceed timeout_seconds (a peer may take that long to end an aborted pass)");
  }
  s.peer_world = !o.devices.empty();
  s.process_world = o.process_rank >= 0;
  if (s.process_world) {
    require(o.process_rank < R, "process_rank", o.process_rank,
            ("must be -1 (no process world) or a rank in [0, " + std::to_string(R) + ")").c_str());
    require(o.devices.empty(), "devices.size()", o.devices.size(),
            "must be empty in a process world (each process serves its rank on its current GPU)");
    o.device_ordered = true;  // no host can order the processes' GPUs
    s.me = o.process_rank;
  }
  s.device_ordered = o.device_ordered;
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
  // SMs per rank: a partition of one GPU (virtual) or a whole GPU (peer, process).
  int sms = 1 << 30;
  for (int r = 0; r < (s.process_world ? 1 : R); ++r) {
    int device_sms = 0;
    MOK_CUDA_CHECK(cudaDeviceGetAttribute(&device_sms, cudaDevAttrMultiProcessorCount, s.rank_device[r]));
    sms = std::min(sms, device_sms);
  }
  const int ranks_per_gpu = s.peer_world || s.process_world ? 1 : R;
  if (o.ctas_per_rank == 0) o.ctas_per_rank = sms / ranks_per_gpu;
  // As many dispatch CTAs as the layer's bytes per FLOP need (plan/sm_split.hpp).
  if (o.comm_ctas_per_rank == 0) o.comm_ctas_per_rank = plan::default_dispatch_ctas(config, o.ctas_per_rank);
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
  s.rank_base.assign(R, nullptr);
  if (!s.device_ordered) {
    DeviceScope on(s.rank_device[0]);
    MOK_CUDA_CHECK(cudaMalloc(&s.world_words, 64));
    if (o.trace_events > 0) {
      s.trace_blocks = static_cast<size_t>(R) * o.ctas_per_rank;
      s.trace_per_block = std::max<size_t>(1, static_cast<size_t>(o.trace_events) / s.trace_blocks);
      MOK_CUDA_CHECK(cudaMalloc(&s.trace_memory, s.trace_count_bytes() +
                                                     s.trace_blocks * s.trace_per_block * sizeof(TraceEvent)));
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
  // The GEMM tickets of a pass are decoded in 32 bits (forward_plan.hpp):
  // refuse a shape whose largest schedule could reach 2^31 tasks.
  const protocol::PassShape shape{kTileM, o.minibatch_rows, o.ring_slots, o.lookahead, H, I, S};
  {
    int most_tokens = 0;
    for (int r = 0; r < R; ++r) most_tokens = std::max(most_tokens, config.tokens_per_rank[r]);
    // The shared tasks of the rank with the most tokens, plus the routed
    // tasks of the largest schedule any rank can have (counted in 64 bits:
    // row_capacity can exceed int32 for an absurd shape).
    const int64_t tasks = protocol::max_task_count<protocol::ForwardPass>(shape, most_tokens, row_capacity);
    if (tasks > 0x7fffffff) {
      throw Error("fused forward: a pass of this shape could have " + std::to_string(tasks) +
                  " GEMM tasks; at most 2^31 - 1 are supported (fewer tokens per pass)");
    }
  }
  // Every rank's layout (a process world reads its peers' memory by it), but
  // memory only for the ranks this object serves.
  for (int r = 0; r < R; ++r) {
    RankLayout& L = s.layouts[r];
    const int64_t T = config.tokens_per_rank[r];
    L.geometry = protocol::forward_geometry(shape, static_cast<int32_t>(T), 0);  // sizes the counters
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
    L.counters[0] = c.take<uint32_t>(protocol::counter_words(L.geometry));
    L.counters[1] = c.take<uint32_t>(protocol::counter_words(L.geometry));
    L.barrier = c.take<protocol::WorldBarrierWords>(1);
    L.maps = c.take<CUtensorMap>(device::kNumMaps);
    const bool staged = s.process_world;
    L.staged_x = c.take<uint16_t>(staged ? static_cast<size_t>(T) * H : 0);
    L.staged_ids = c.take<int32_t>(staged ? static_cast<size_t>(T) * k : 0);
    L.bytes = align_up(c.offset, 1024);
    if (s.process_world && r != s.me) continue;
    DeviceScope on(s.rank_device[r]);
    MOK_CUDA_CHECK(cudaMalloc(&s.rank_memory[r], L.bytes));
    s.rank_base[r] = s.rank_memory[r];
    // Both counter sets and the barrier words start at zero; device-ordered
    // passes never zero them from the host again. (Synchronised below: a
    // process world's peers may write here as soon as they hold our handle.)
    MOK_CUDA_CHECK(cudaMemset(s.rank_memory[r] + L.counters[0], 0, L.maps - L.counters[0]));
    if (s.peer_world && !s.device_ordered) {
      cudaEvent_t e;
      MOK_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      s.ready.push_back(e);
      MOK_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      s.zeroed.push_back(e);
    }
  }
  for (int r = 0; r < R; ++r) {
    if (s.rank_memory[r] == nullptr) continue;
    DeviceScope on(s.rank_device[r]);
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
  }

  FusedForwardParams& p = s.params;
  p.world_size = R;
  p.first_rank = s.process_world ? s.me : 0;
  p.launch_ranks = s.process_world ? 1 : R;
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
    p.trace = reinterpret_cast<TraceEvent*>(s.trace_memory + s.trace_count_bytes());
    p.trace_capacity = static_cast<uint32_t>(s.trace_per_block);
  }
  p.epoch = 0;
  p.barrier_timeout_ns = static_cast<uint64_t>(o.barrier_timeout_seconds * 1e9);
  for (int r = 0; r < R; ++r) {
    if (s.rank_base[r] != nullptr) s.fill_view(r);
  }
  const bool system_scope = s.peer_world || s.process_world;
  for (int r = 0; r < R; ++r) {
    if (s.rank_memory[r] == nullptr || (!system_scope && r > 0)) continue;
    DeviceScope on(s.rank_device[r]);
    if (system_scope) {
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

// Rank r's workspace pointers in the table (its base known: owned or mapped).
// Counters are bound per pass (bind_counters); a process world's peers expose
// their staged inputs as x and ids.
void FusedForward::State::fill_view(int r) {
  const RankLayout& L = layouts[r];
  uint8_t* base = rank_base[r];
  RankView& v = params.ranks[r];
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
  v.maps = reinterpret_cast<const CUtensorMap*>(base + L.maps);
  v.barrier = reinterpret_cast<protocol::WorldBarrierWords*>(base + L.barrier);
  if (process_world) {
    v.x = reinterpret_cast<const uint16_t*>(base + L.staged_x);
    v.ids = reinterpret_cast<const int32_t*>(base + L.staged_ids);
  }
}

// Host-ordered: every rank's set 0, with the world's abort flag and report in
// world_words. Device-ordered: set epoch % 2 of every rank, the world's abort
// flag and report being those of rank 0's set (so they outlive the pass until
// every host has read them; docs/protocol.md), and the other set idle.
void FusedForward::State::bind_counters(uint32_t pass_epoch) {
  const int set = device_ordered ? protocol::counter_set_of(pass_epoch) : 0;
  uint32_t* abort = world_words;
  auto* stall = reinterpret_cast<protocol::StallReport*>(world_words + 1);
  if (device_ordered) {
    const protocol::ForwardCounters rank0 = protocol::carve_counters(
        layouts[0].geometry, reinterpret_cast<uint32_t*>(rank_base[0] + layouts[0].counters[set]));
    abort = rank0.abort;
    stall = rank0.stall;
  }
  for (int r = 0; r < config.world_size; ++r) {
    if (rank_base[r] == nullptr) continue;
    const RankLayout& L = layouts[r];
    RankView& v = params.ranks[r];
    v.counters = protocol::carve_counters(L.geometry, reinterpret_cast<uint32_t*>(rank_base[r] + L.counters[set]),
                                          abort, stall);
    v.idle_counters = reinterpret_cast<uint32_t*>(rank_base[r] + L.counters[1 - set]);
  }
}

void FusedForward::State::upload_maps(const RankTensors& t, int r, cudaStream_t stream) {
  const LayerConfig& c = config;
  const int H = c.hidden, I = c.intermediate, S = c.shared_width(), El = c.experts_per_rank();
  const int64_t ring_rows = static_cast<int64_t>(options.ring_slots) * options.minibatch_rows;
  const cuuint64_t h2 = static_cast<cuuint64_t>(H) * 2, i2 = static_cast<cuuint64_t>(I) * 2,
                   s2 = static_cast<cuuint64_t>(S) * 2;
  const RankView& v = params.ranks[r];
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

// Host-ordered passes: counters start at zero every pass (a few KB per rank);
// rank 0 also clears the world's abort flag and stall report.
void FusedForward::State::zero_counters(int r, cudaStream_t stream) {
  if (r == 0) MOK_CUDA_CHECK(cudaMemsetAsync(world_words, 0, 64, stream));
  const RankLayout& L = layouts[r];
  MOK_CUDA_CHECK(cudaMemsetAsync(rank_memory[r] + L.counters[0], 0,
                                 protocol::counter_words(L.geometry) * sizeof(uint32_t), stream));
}

void FusedForward::State::check_tensors(const RankTensors& t, int r) const {
  const bool has_tokens = config.tokens_per_rank[r] > 0;
  const int S = config.shared_width();
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
}

static bool tensors_moved(const RankTensors& old, const RankTensors& t) {
  return old.x != t.x || old.w13 != t.w13 || old.w2 != t.w2 || old.shared_w13 != t.shared_w13 ||
         old.shared_w2 != t.shared_w2;
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
  if (s.process_world) {
    throw Error("run: a process world runs only this rank's tensors: run(mine, stream)");
  }
  if (static_cast<int>(ranks.size()) != R) {
    throw Error("run: got tensors for " + std::to_string(ranks.size()) + " ranks; world_size is " + std::to_string(R));
  }
  const size_t expected_streams = s.peer_world ? static_cast<size_t>(R) : 1;
  if (streams.size() != expected_streams) {
    throw Error("run: got " + std::to_string(streams.size()) + " streams; this " +
                (s.peer_world ? "peer world needs one per rank (" : "virtual world needs one (") +
                std::to_string(expected_streams) + ")");
  }
  for (int r = 0; r < R; ++r) s.check_tensors(ranks[r], r);
  launch(ranks, streams);
}

// Device-ordered passes: `stream` (of launch `launch`, on `device`) waits for
// the previous pass's launch, whatever stream that was on. Refuses stream
// capture: the pass number is a kernel parameter, so a replayed graph would
// run stale passes the world barrier cannot order.
void FusedForward::State::follow_last_pass(int launch, int device, cudaStream_t stream) {
  DeviceScope on(device);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MOK_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    throw Error("run: device-ordered passes cannot be captured in a CUDA graph (each pass's number is a kernel "
                "parameter); use the host-ordered virtual or peer world for graphs");
  }
  if (pass_done.size() <= static_cast<size_t>(launch)) {
    pass_done.resize(static_cast<size_t>(launch) + 1, nullptr);
    pass_done_recorded.resize(static_cast<size_t>(launch) + 1, false);
  }
  if (pass_done[launch] == nullptr) {
    MOK_CUDA_CHECK(cudaEventCreateWithFlags(&pass_done[launch], cudaEventDisableTiming));
  }
  if (pass_done_recorded[launch]) MOK_CUDA_CHECK(cudaStreamWaitEvent(stream, pass_done[launch], 0));
}

void FusedForward::run(const RankTensors& mine, CUstream_st* stream) {
  State& s = *state_;
  if (!s.process_world) {
    throw Error("run(mine): only a process world (options.process_rank >= 0) runs one rank's tensors");
  }
  if (s.config.world_size > 1 && !s.imported) {
    throw Error("run: call import_peers() with every rank's handle first (the peers' workspaces are not mapped)");
  }
  s.check_tensors(mine, s.me);
  // Peers read this rank's inputs in its workspace: the caller's tensors are
  // not shareable (a caching allocator's blocks), the staging copies are.
  const RankLayout& L = s.layouts[s.me];
  const int64_t T = s.config.tokens_per_rank[s.me];
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  RankTensors staged = mine;
  staged.x = s.rank_base[s.me] + L.staged_x;
  staged.expert_ids = reinterpret_cast<const int32_t*>(s.rank_base[s.me] + L.staged_ids);
  // Safe to overwrite the staged inputs once the previous pass's kernel has
  // ended: it ended only after every rank finished that pass (the end barrier).
  s.follow_last_pass(0, s.rank_device[s.me], st);
  if (T > 0) {
    DeviceScope on(s.rank_device[s.me]);
    MOK_CUDA_CHECK(cudaMemcpyAsync(const_cast<void*>(staged.x), mine.x,
                                   static_cast<size_t>(T) * s.config.hidden * sizeof(uint16_t),
                                   cudaMemcpyDeviceToDevice, st));
    MOK_CUDA_CHECK(cudaMemcpyAsync(const_cast<int32_t*>(staged.expert_ids), mine.expert_ids,
                                   static_cast<size_t>(T) * s.config.top_k * sizeof(int32_t),
                                   cudaMemcpyDeviceToDevice, st));
  }
  launch(std::span<const RankTensors>(&staged, 1), std::span<CUstream_st* const>(&stream, 1));
}

// The launches of one pass. `ranks` holds every rank's tensors, or (process
// world) this rank's only; `streams` one per launch.
void FusedForward::launch(std::span<const RankTensors> ranks, std::span<CUstream_st* const> streams) {
  State& s = *state_;
  const int R = s.config.world_size;
  if (s.broken) {
    throw Error("run: an earlier pass broke this world's barrier (a rank never started or finished a pass); "
                "this object cannot order passes any more: make a new one");
  }
  // Ranks this process launches, and where their tensors are in `ranks`.
  const int first = s.process_world ? s.me : 0;
  const int count = s.process_world ? 1 : R;
  bool maps_changed = s.last_tensors.size() != ranks.size();
  for (int i = 0; i < count && !maps_changed; ++i) maps_changed = tensors_moved(s.last_tensors[i], ranks[i]);

  FusedForwardParams& p = s.params;
  for (int i = 0; i < count; ++i) {
    RankView& v = p.ranks[first + i];
    v.x = static_cast<const uint16_t*>(ranks[i].x);
    v.ids = ranks[i].expert_ids;
    v.weights = ranks[i].weights;
    v.out = static_cast<uint16_t*>(ranks[i].out);
  }
  if (s.device_ordered) {
    if (s.epoch == UINT32_MAX) throw Error("run: this world ran 2^32 - 1 passes; make a new one");
    p.epoch = ++s.epoch;
  }
  s.bind_counters(p.epoch);
  auto stream_of = [&](int i) { return reinterpret_cast<cudaStream_t>(streams[static_cast<size_t>(i)]); };

  if (s.device_ordered) {
    // No host ordering at all: each launch waits for the world inside the
    // kernel (world_barrier_role.cuh), and zeroes its next counter set itself.
    const bool system_scope = s.peer_world || s.process_world;
    // A pass that failed to launch on some rank has used up its number there
    // and not on the others: the world can no longer be ordered.
    try {
      for (int i = 0; i < (system_scope ? count : 1); ++i) {
        const int r = first + i;
        s.follow_last_pass(i, s.rank_device[r], stream_of(i));
        DeviceScope on(s.rank_device[r]);
        if (system_scope) {
          if (maps_changed) s.upload_maps(ranks[i], r, stream_of(i));
          FusedForwardParams mine = p;
          mine.first_rank = r;
          mine.launch_ranks = 1;
          launch_fused<cuda::thread_scope_system>(mine, s.options.ctas_per_rank, stream_of(i));
        } else {
          if (maps_changed) {
            for (int q = 0; q < R; ++q) s.upload_maps(ranks[q], q, stream_of(0));
          }
          launch_fused<cuda::thread_scope_device>(p, R * s.options.ctas_per_rank, stream_of(0));
        }
        MOK_CUDA_CHECK(cudaEventRecord(s.pass_done[i], stream_of(i)));
        s.pass_done_recorded[i] = true;
      }
    } catch (...) {
      s.broken = true;
      throw;
    }
  } else if (!s.peer_world) {
    cudaStream_t st = stream_of(0);
    // Tensor maps change only when a tensor moves; steady-state runs skip them.
    if (maps_changed) {
      for (int r = 0; r < R; ++r) s.upload_maps(ranks[r], r, st);
    }
    for (int r = 0; r < R; ++r) s.zero_counters(r, st);
    if (s.trace_memory != nullptr) MOK_CUDA_CHECK(cudaMemsetAsync(s.trace_memory, 0, s.trace_count_bytes(), st));
    launch_fused<cuda::thread_scope_device>(p, R * s.options.ctas_per_rank, st);
  } else {
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
      if (maps_changed) s.upload_maps(ranks[r], r, stream_of(r));
      s.zero_counters(r, stream_of(r));
      if (r == 0 && s.trace_memory != nullptr) {
        MOK_CUDA_CHECK(cudaMemsetAsync(s.trace_memory, 0, s.trace_count_bytes(), stream_of(r)));
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

std::vector<uint8_t> FusedForward::export_handle() const {
  const State& s = *state_;
  if (!s.process_world) {
    throw Error("export_handle: only a process world (options.process_rank >= 0) exports its workspace");
  }
  world::WorldHandle handle;
  handle.world_size = s.config.world_size;
  handle.rank = s.me;
  handle.fingerprint = world::layout_fingerprint(s.config, s.options, kTileM);
  handle.bytes = s.layouts[s.me].bytes;
  cudaDeviceProp prop{};
  MOK_CUDA_CHECK(cudaGetDeviceProperties(&prop, s.rank_device[s.me]));
  std::memcpy(handle.gpu_uuid, &prop.uuid, sizeof(handle.gpu_uuid));
  DeviceScope on(s.rank_device[s.me]);
  MOK_CUDA_CHECK(cudaIpcGetMemHandle(&handle.ipc, s.rank_memory[s.me]));
  return world::pack_handle(handle);
}

void FusedForward::import_peers(std::span<const std::vector<uint8_t>> handles) {
  State& s = *state_;
  const int R = s.config.world_size;
  if (!s.process_world) {
    throw Error("import_peers: only a process world (options.process_rank >= 0) imports its peers");
  }
  if (s.imported) throw Error("import_peers: the peers are imported already (once per object)");
  if (static_cast<int>(handles.size()) != R) {
    throw Error("import_peers: got " + std::to_string(handles.size()) + " handles; world_size is " +
                std::to_string(R) + " (one per rank, in rank order, this rank's included)");
  }
  cudaDeviceProp prop{};
  MOK_CUDA_CHECK(cudaGetDeviceProperties(&prop, s.rank_device[s.me]));
  const uint64_t fingerprint = world::layout_fingerprint(s.config, s.options, kTileM);
  std::vector<world::WorldHandle> peers;
  for (int q = 0; q < R; ++q) {
    const world::WorldHandle h = world::unpack_handle(handles[q], q);
    const std::string who = "import_peers: handles[" + std::to_string(q) + "]";
    if (h.world_size != R) {
      throw Error(who + " comes from a world of " + std::to_string(h.world_size) + " ranks; this one has " +
                  std::to_string(R));
    }
    if (h.rank != q) {
      throw Error(who + " is rank " + std::to_string(h.rank) + "'s handle (give them in rank order)");
    }
    if (h.fingerprint != fingerprint || h.bytes != s.layouts[q].bytes) {
      throw Error(who + ": rank " + std::to_string(q) + " was made with another layer config or options "
                  "(dims, tokens per rank, minibatch_rows, ring_slots, comm_ctas_per_rank must be equal on every rank)");
    }
    if (q != s.me && std::memcmp(h.gpu_uuid, &prop.uuid, sizeof(h.gpu_uuid)) == 0) {
      throw Error(who + ": rank " + std::to_string(q) + " runs on this process's GPU too; a process world "
                  "needs one GPU per rank (each pass needs every SM of its GPU)");
    }
    peers.push_back(h);
  }
  DeviceScope on(s.rank_device[s.me]);
  try {
    for (int q = 0; q < R; ++q) {
      if (q == s.me) continue;
      void* base = nullptr;
      // IPC memory needs no cudaDeviceEnablePeerAccess: the lazy flag maps it
      // for peer access (NVLink or PCIe P2P).
      MOK_CUDA_CHECK(cudaIpcOpenMemHandle(&base, peers[q].ipc, cudaIpcMemLazyEnablePeerAccess));
      s.rank_base[q] = static_cast<uint8_t*>(base);
      s.ipc_mapped.push_back(q);
      s.fill_view(q);
    }
  } catch (...) {
    s.close_mappings();
    throw;
  }
  s.imported = true;
}

void FusedForward::close_peers() {
  State& s = *state_;
  if (!s.process_world) throw Error("close_peers: only a process world maps peers");
  DeviceScope on(s.rank_device[s.me]);
  // No pass of ours may still read or write the mappings.
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  s.close_mappings();
}

void FusedForward::check(std::span<CUstream_st* const> streams) {
  State& s = *state_;
  for (size_t i = 0; i < streams.size(); ++i) {
    DeviceScope on(s.rank_device[s.peer_world ? i : (s.process_world ? s.me : 0)]);
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

// Device-ordered: a barrier wait that gave up (on any rank this object
// serves) breaks the world for good; it explains any other report, so it
// comes first.
void FusedForward::State::check_barrier_reports() {
  for (int r = 0; r < config.world_size; ++r) {
    if (rank_memory[r] == nullptr) continue;
    protocol::WorldBarrierWords words;
    {
      DeviceScope on(rank_device[r]);
      MOK_CUDA_CHECK(cudaMemcpy(&words, rank_memory[r] + layouts[r].barrier, sizeof(words), cudaMemcpyDeviceToHost));
    }
    if (words.broken == 0) continue;
    broken = true;
    const protocol::StallReport& report = words.stall;
    const bool start = report.counter == static_cast<uint32_t>(protocol::CounterId::kWorldStarted);
    using std::to_string;
    throw Error("fused forward: rank " + to_string(report.waiter) + " waited " +
                to_string(options.barrier_timeout_seconds) + " s for rank " + to_string(report.owner) + " to " +
                (start ? "start" : "finish") + " pass " + to_string(report.target) + " (it had " +
                (start ? "started" : "finished") + " pass " + to_string(report.observed) +
                "). Every rank must run every pass (the same number of run() calls), on a GPU it has to "
                "itself; this world object cannot run further passes (" + options.describe() + ")");
  }
}

void FusedForward::check_report() {
  State& s = *state_;
  uint32_t words[1 + sizeof(protocol::StallReport) / 4];
  if (s.device_ordered) {
    if (s.epoch == 0) return;
    s.check_barrier_reports();
    // The pass's abort flag and report: rank 0's set of this pass, stable
    // until the end of the next pass (which this host has not enqueued).
    const int set = protocol::counter_set_of(s.epoch);
    const protocol::ForwardCounters rank0 = protocol::carve_counters(
        s.layouts[0].geometry, reinterpret_cast<uint32_t*>(s.rank_base[0] + s.layouts[0].counters[set]));
    static_assert(sizeof(words) == sizeof(uint32_t) + sizeof(protocol::StallReport));
    DeviceScope on(s.report_device());
    MOK_CUDA_CHECK(cudaMemcpy(words, rank0.abort, sizeof(uint32_t), cudaMemcpyDefault));
    MOK_CUDA_CHECK(cudaMemcpy(words + 1, rank0.stall, sizeof(protocol::StallReport), cudaMemcpyDefault));
  } else {
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
  std::vector<uint32_t> counts(s.trace_blocks);
  MOK_CUDA_CHECK(cudaMemcpy(counts.data(), s.trace_memory, counts.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  std::vector<TraceEvent> all(s.trace_blocks * s.trace_per_block);
  MOK_CUDA_CHECK(cudaMemcpy(all.data(), s.trace_memory + s.trace_count_bytes(), all.size() * sizeof(TraceEvent),
                            cudaMemcpyDeviceToHost));
  std::vector<TraceEvent> events;
  for (size_t b = 0; b < s.trace_blocks; ++b) {
    if (counts[b] > s.trace_per_block) {
      throw Error("trace: block " + std::to_string(b) + " recorded " + std::to_string(counts[b]) +
                  " events, more than its share of trace_events (" + std::to_string(s.trace_per_block) +
                  " = " + std::to_string(s.options.trace_events) + " / " + std::to_string(s.trace_blocks) +
                  " blocks); raise trace_events");
    }
    events.insert(events.end(), all.begin() + static_cast<std::ptrdiff_t>(b * s.trace_per_block),
                  all.begin() + static_cast<std::ptrdiff_t>(b * s.trace_per_block + counts[b]));
  }
  return events;
}

}  // namespace mok
