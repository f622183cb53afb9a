// What every world of the fused forward shares: the resolved config and
// options, every rank's layout, the memory this process owns or maps, the
// kernel's pointer table, and the ordering of passes (the end of the last
// pass of each launch, an event). The world strategies (world.hpp) decide
// which ranks this process allocates and how a pass is launched; this state
// is where they put it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "device/kernel/fused_forward_params.hpp"
#include "mok/fused_forward.hpp"
#include "mok/layer_config.hpp"
#include "protocol/counters.hpp"
#include "world/forward_options.hpp"
#include "world/kernel_facts.hpp"
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

struct WorldState {
  LayerConfig config;
  FusedForwardOptions options;  // with the defaults resolved
  KernelFacts kernel;
  WorldKind kind = WorldKind::kVirtual;
  std::vector<int> rank_device;       // GPU of each rank's workspace
  std::vector<RankLayout> layouts;    // every rank's (a process world reads its peers' memory by them)
  PassStateLayout pass_state;         // of every rank's pass state, the world's own and a caller's
  std::vector<Launch> launches;       // of every pass, in order (the world's choice)
  std::vector<uint8_t*> rank_memory;  // allocations this object owns
  std::vector<uint8_t*> rank_base;    // every rank's workspace as this process sees it (null: not mapped)
  uint32_t* world_words = nullptr;    // host-ordered: on the report GPU: [0] abort, [1..] StallReport
  uint8_t* trace_memory = nullptr;    // per world block: its event count; then its events (report GPU)
  size_t trace_blocks = 0, trace_per_block = 0;
  device::FusedForwardParams params{};
  std::vector<RankTensors> last_tensors;  // the tensor maps were built for these
  uint32_t epoch = 0;                     // device-ordered: the last pass enqueued (0: none yet)
  bool broken = false;                    // a barrier wait gave up: no further pass can be ordered
  // Per launch: the end of the last pass enqueued there. Every pass waits for
  // it before touching the workspace (maps, counters, staged inputs), even
  // when the caller switched streams; check() waits for it.
  std::vector<cudaEvent_t> pass_done;
  bool pass_done_recorded = false;  // false before the first pass, and after a captured one
  // Process world: the last pass's report, read just before the peers were
  // unmapped (it lives in rank 0's workspace, which may be a peer's).
  std::optional<PassReport> report_at_close;

  WorldState() = default;
  WorldState(const WorldState&) = delete;
  WorldState& operator=(const WorldState&) = delete;
  // Frees everything this object owns; the caller's current GPU stays current.
  ~WorldState();

  bool device_ordered() const { return options.device_ordered; }
  bool system_scope() const { return kind != WorldKind::kVirtual; }
  // The GPU the host reads a pass's reports and trace on: rank 0's, or this
  // process's in a process world (where rank 0 may be another process).
  int report_device() const;
  size_t trace_count_bytes() const { return world::trace_count_bytes(trace_blocks); }

  // Allocates rank r's workspace on its GPU, zeroes its counters and barrier
  // words, and fills its view.
  void allocate_rank(int r);
  // Host-ordered worlds: the world's abort flag and report, and the trace.
  void allocate_report_words();
  // One "pass done" event per launch (on the launch's GPU).
  void create_pass_events();
  // The parts of the pointer table every pass shares.
  void fill_params();
  // Rank r's workspace pointers in the table (its base known: owned or mapped).
  void fill_view(int r);
  // Points rank r's view at the pass state a pass uses: `state` (a caller's),
  // or the world's own in r's workspace when null. Only r itself reads it
  // (peers read the schedule's length from r's counters), so a caller's state
  // need not be visible to the other ranks.
  void use_pass_state(int r, void* state);
  // Points every known rank's view at the counter set of pass `epoch`.
  void bind_counters(uint32_t pass_epoch);
  // Host-ordered passes: rank r's counters (and with rank 0, the world's
  // report words) back to zero, on `stream`.
  void zero_counters(int r, cudaStream_t stream);
};

}  // namespace mok::world
