// A timeline of one fused pass, for finding where its time goes: optional
// (FusedForwardOptions::trace_events), written by the kernel with %globaltimer
// stamps and the SM's cycle counter, read back by the host. Plain data shared
// by host and device code.
//
// Why cycles too: the H200 runs at whatever clock its power cap allows, so
// the same work takes more or fewer nanoseconds from one pass (or machine) to
// the next. A span in SM cycles compares work across passes; ns / cycles
// gives the clock the span ran at.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mok {

// What one event spans. GEMM events carry the task kind in `detail`
// (TraceTask); dispatch events carry the m-tile.
enum class TraceKind : uint8_t {
  kSchedule = 0,      // a dispatch CTA: kernel start -> its share of the schedule built
  kDispatchWait = 1,  // a dispatch CTA: waiting for a ring slot to be free
  kDispatchCopy = 2,  // a dispatch CTA: copying one m-tile's rows and announcing it
  kTaskWait = 3,      // a GEMM producer: ticket taken -> the task's inputs ready
  kMainloop = 4,      // GEMM consumers: task received -> last wgmma retired
  kEpilogue = 5,      // GEMM consumers: results converted and stored
  kCombineWait = 6,   // one combine warp per CTA: waiting for the shared expert and every down task
  kCombine = 7,       // that warp: its share of the weighted sums
  kSignal = 8,        // a GEMM CTA's signaler: publishing a finished task (beside the consumers)
  kHandoff = 9,       // GEMM consumers: proxy fence, handing the task to the signaler
  kCount = 10,
};

enum class TraceTask : int32_t { kSharedGateUp = 0, kSharedDown = 1, kGateUp = 2, kDown = 3 };

struct TraceEvent {
  uint64_t begin_ns;
  uint64_t end_ns;
  int32_t detail;
  uint32_t cycles;  // the span in cycles of the SM that recorded it (saturates at 2^32 - 1)
  uint16_t cta;     // block index within its launch
  uint8_t rank;
  uint8_t kind;     // TraceKind
};
static_assert(sizeof(TraceEvent) == 32);

const char* trace_kind_name(TraceKind kind);
const char* trace_task_name(TraceTask task);

// Totals per (kind, task) over one pass, and what the GEMM CTAs' consumers did
// with the pass's wall time.
struct TraceSummary {
  struct Row {
    TraceKind kind;
    int32_t task;  // TraceTask for GEMM kinds, -1 otherwise
    int64_t count = 0;
    double total_us = 0;
    double mean_us = 0;
    double max_us = 0;
    double mean_kcycles = 0;  // mean span in thousands of SM cycles
    double mhz = 0;           // SM clock over these spans: their cycles over their time
  };
  double span_us = 0;  // first begin -> last end over every event
  int gemm_ctas = 0;   // CTAs with at least one mainloop event
  // Consumer time of the GEMM CTAs, as fractions of gemm_ctas * span:
  double mainloop_share = 0;  // inside a mainloop
  double epilogue_share = 0;  // inside an epilogue or its handoff
  double head_share = 0;      // before the CTA's first task
  double gap_share = 0;       // between two tasks (waiting for inputs or for the producer)
  double tail_share = 0;      // after the CTA's last task
  double mainloop_mhz = 0;    // SM clock during the GEMM mainloops
  std::vector<Row> rows;
};

TraceSummary summarize_trace(std::span<const TraceEvent> events);
std::string describe(const TraceSummary& summary);

}  // namespace mok
