#include "world/world_core.hpp"

#include <utility>

#include "common/cuda_check.hpp"
#include "world/device_scope.hpp"

namespace mok::world {

namespace {
// Host-ordered worlds: [0] the abort flag, [1..] the StallReport.
constexpr size_t kReportWordsBytes = sizeof(uint32_t) + sizeof(protocol::StallReport);
}  // namespace

WorldCore::~WorldCore() {
  // Each release makes its GPU current in a DeviceScope, which puts the
  // caller's GPU back. Errors are dropped: a destructor must not throw, and a
  // context a failed pass broke refuses every call.
  auto release = [](int device, auto&& free) {
    try {
      DeviceScope on(device);
      free();
    } catch (...) {
    }
  };
  for (size_t i = 0; i < pass_done.size(); ++i) {
    if (pass_done[i] != nullptr) release(launches[i].device, [&] { cudaEventDestroy(pass_done[i]); });
  }
  for (size_t r = 0; r < rank_memory.size(); ++r) {
    if (rank_memory[r] != nullptr) release(rank_device[r], [&] { cudaFree(rank_memory[r]); });
  }
  if (world_words != nullptr) release(report_device(), [&] { cudaFree(world_words); });
  if (trace_memory != nullptr) release(report_device(), [&] { cudaFree(trace_memory); });
}

// Every rank of a process world is on this process's GPU as far as this
// object knows (rank_devices()), so rank 0's GPU is the report GPU in every
// world.
int WorldCore::report_device() const { return rank_device[0]; }

void WorldCore::place(WorldKind world, int ranks, std::vector<int> devices, int own_rank, bool device_ordered_passes) {
  kind = world;
  world_size = ranks;
  rank_device = std::move(devices);
  process_rank = own_rank;
  ordered_on_device = device_ordered_passes;
  rank_memory.assign(static_cast<size_t>(ranks), nullptr);
  rank_base.assign(static_cast<size_t>(ranks), nullptr);
}

void WorldCore::allocate_workspace(int r, size_t bytes, Region zeroed) {
  DeviceScope on(rank_device[static_cast<size_t>(r)]);
  MOK_CUDA_CHECK(cudaMalloc(&rank_memory[static_cast<size_t>(r)], bytes));
  rank_base[static_cast<size_t>(r)] = rank_memory[static_cast<size_t>(r)];
  MOK_CUDA_CHECK(cudaMemset(rank_memory[static_cast<size_t>(r)] + zeroed.offset, 0, zeroed.bytes));
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
}

void WorldCore::allocate_report_words(size_t blocks, int trace_events) {
  DeviceScope on(report_device());
  MOK_CUDA_CHECK(cudaMalloc(&world_words, kReportWordsBytes));
  // Zero now, so that check() before the first pass finds no report.
  MOK_CUDA_CHECK(cudaMemset(world_words, 0, kReportWordsBytes));
  if (trace_events > 0) {
    const TraceMemory trace = allocate_trace(blocks, trace_events);
    trace_memory = trace.memory;
    trace_blocks = trace.blocks;
    trace_per_block = trace.per_block;
  }
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
}

void WorldCore::create_pass_events() {
  pass_done.assign(launches.size(), nullptr);
  for (size_t i = 0; i < launches.size(); ++i) {
    DeviceScope on(launches[i].device);
    MOK_CUDA_CHECK(cudaEventCreateWithFlags(&pass_done[i], cudaEventDisableTiming));
  }
}

void WorldCore::zero_report_words(cudaStream_t stream) {
  MOK_CUDA_CHECK(cudaMemsetAsync(world_words, 0, kReportWordsBytes, stream));
}

PassReport WorldCore::read_report_words() const {
  PassReport report;
  DeviceScope on(report_device());
  MOK_CUDA_CHECK(cudaMemcpy(&report.abort, world_words, sizeof(uint32_t), cudaMemcpyDeviceToHost));
  MOK_CUDA_CHECK(cudaMemcpy(&report.stall, world_words + 1, sizeof(report.stall), cudaMemcpyDeviceToHost));
  return report;
}

std::vector<TraceEvent> WorldCore::read_trace(const char* who, int trace_events) const {
  DeviceScope on(report_device());
  return TraceMemory{trace_memory, trace_blocks, trace_per_block}.read(who, trace_events);
}

bool any_capturing(const WorldCore& core, std::span<const cudaStream_t> streams) {
  bool capturing = false;
  for (size_t i = 0; i < core.launches.size(); ++i) {
    DeviceScope on(core.launches[i].device);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    MOK_CUDA_CHECK(cudaStreamIsCapturing(streams[i], &status));
    capturing = capturing || status != cudaStreamCaptureStatusNone;
  }
  return capturing;
}

}  // namespace mok::world
