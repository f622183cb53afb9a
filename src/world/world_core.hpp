// What a world keeps whatever its passes compute, shared by the fused
// forward (world_state.hpp) and the fused backward (fused_backward.cu): the
// GPU of every rank and the launches of a pass (the world's choice,
// world.hpp), the workspace memory this process owns or maps, the report
// words and trace of host-ordered passes, and the ordering of passes (the
// end of the last pass of each launch, an event). What a pass kind lays out
// in a workspace, and its pointer table, are its own.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "mok/fused_forward.hpp"
#include "protocol/counters.hpp"
#include "world/forward_options.hpp"
#include "world/trace_memory.hpp"
#include "world/workspace_layout.hpp"

namespace mok::world {

// What a pass left for the host: its abort flag and the first stall (or bad
// routing entry) it recorded.
struct PassReport {
  uint32_t abort = 0;
  protocol::StallReport stall{};
};

// One launch of a pass: the GPU it runs on and the ranks it serves.
struct Launch {
  int device = 0;
  int first_rank = 0;
  int ranks = 0;
};

struct WorldCore {
  WorldKind kind = WorldKind::kVirtual;
  int world_size = 0;
  int process_rank = -1;           // a process world's own rank, else -1
  bool ordered_on_device = false;  // device-ordered passes (options.device_ordered)
  std::vector<int> rank_device;       // GPU of each rank's workspace
  std::vector<Launch> launches;       // of every pass, in order (the world's choice)
  std::vector<uint8_t*> rank_memory;  // allocations this object owns
  std::vector<uint8_t*> rank_base;    // every rank's workspace as this process sees it (null: not mapped)
  uint32_t* world_words = nullptr;    // host-ordered: on the report GPU: [0] abort, [1..] StallReport
  uint8_t* trace_memory = nullptr;    // per world block: its event count; then its events (report GPU)
  size_t trace_blocks = 0, trace_per_block = 0;
  uint32_t epoch = 0;                 // device-ordered: the last pass enqueued (0: none yet)
  bool broken = false;                // a barrier wait gave up: no further pass can be ordered
  // Per launch: the end of the last pass enqueued there. Every pass waits for
  // it before touching the workspace (maps, counters, staged inputs), even
  // when the caller switched streams; check() waits for it.
  std::vector<cudaEvent_t> pass_done;
  bool pass_done_recorded = false;  // false before the first pass, and after a captured one
  // Process world: the last pass's report, read just before the peers were
  // unmapped (it lives in rank 0's workspace, which may be a peer's).
  std::optional<PassReport> report_at_close;

  WorldCore() = default;
  WorldCore(const WorldCore&) = delete;
  WorldCore& operator=(const WorldCore&) = delete;
  // Frees everything this object owns; the caller's current GPU stays current.
  ~WorldCore();

  bool device_ordered() const { return ordered_on_device; }
  bool system_scope() const { return kind != WorldKind::kVirtual; }
  // The GPU the host reads a pass's reports and trace on: rank 0's, or this
  // process's in a process world (where rank 0 may be another process).
  int report_device() const;
  size_t trace_count_bytes() const { return world::trace_count_bytes(trace_blocks); }

  // The world's shape and GPUs; sizes the per-rank vectors.
  void place(WorldKind world, int ranks, std::vector<int> devices, int own_rank, bool device_ordered_passes);
  // Allocates `bytes` of rank r's workspace on its GPU and zeroes `zeroed`
  // of it (synchronised: a process world's peers may write there as soon as
  // they hold our handle).
  void allocate_workspace(int r, size_t bytes, Region zeroed);
  // Host-ordered worlds: the world's abort flag and report, and (with
  // trace_events > 0) a trace of `trace_events` events for each of
  // `blocks` CTAs, all on the report GPU.
  void allocate_report_words(size_t blocks, int trace_events);
  // One "pass done" event per launch (on the launch's GPU).
  void create_pass_events();
  // Host-ordered: the world's abort flag and report back to zero, on `stream`
  // (of a launch on the report GPU).
  void zero_report_words(cudaStream_t stream);
  // Host-ordered: what the last pass left in the report words (it must have ended).
  PassReport read_report_words() const;
  // The trace of the last pass (it must have ended).
  std::vector<TraceEvent> read_trace(const char* who, int trace_events) const;
};

// Whether any launch's stream is capturing a CUDA graph.
bool any_capturing(const WorldCore& core, std::span<const cudaStream_t> streams);

}  // namespace mok::world
