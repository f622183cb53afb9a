// Summaries of a fused pass's timeline (include/mok/pass_trace.hpp).
#include "mok/pass_trace.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

namespace mok {

const char* trace_kind_name(TraceKind kind) {
  switch (kind) {
    case TraceKind::kSchedule: return "schedule";
    case TraceKind::kDispatchWait: return "dispatch wait";
    case TraceKind::kDispatchCopy: return "dispatch copy";
    case TraceKind::kTaskWait: return "task wait";
    case TraceKind::kMainloop: return "mainloop";
    case TraceKind::kEpilogue: return "epilogue";
    case TraceKind::kCombineWait: return "combine wait";
    case TraceKind::kCombine: return "combine";
    case TraceKind::kSignal: return "signal";
    case TraceKind::kHandoff: return "handoff";
    case TraceKind::kCount: break;
  }
  return "unknown";
}

const char* trace_task_name(TraceTask task) {
  switch (task) {
    case TraceTask::kSharedGateUp: return "shared gate/up";
    case TraceTask::kSharedDown: return "shared down";
    case TraceTask::kGateUp: return "gate/up";
    case TraceTask::kDown: return "down";
  }
  return "unknown";
}

namespace {

bool is_gemm_kind(TraceKind kind) {
  return kind == TraceKind::kTaskWait || kind == TraceKind::kMainloop || kind == TraceKind::kEpilogue ||
         kind == TraceKind::kSignal || kind == TraceKind::kHandoff;
}

}  // namespace

TraceSummary summarize_trace(std::span<const TraceEvent> events) {
  TraceSummary s;
  if (events.empty()) return s;
  uint64_t first = events[0].begin_ns, last = events[0].end_ns;
  for (const TraceEvent& e : events) {
    first = std::min(first, e.begin_ns);
    last = std::max(last, e.end_ns);
  }
  s.span_us = static_cast<double>(last - first) * 1e-3;

  std::map<std::pair<int, int32_t>, TraceSummary::Row> rows;
  std::map<std::pair<int, int32_t>, std::pair<double, double>> cycles_and_ns;  // per row
  double mainloop_cycles = 0, mainloop_ns = 0;
  // Consumer intervals of each GEMM CTA, keyed by (rank, cta).
  std::map<std::pair<int, int>, std::vector<std::pair<uint64_t, uint64_t>>> busy;
  for (const TraceEvent& e : events) {
    const auto kind = static_cast<TraceKind>(e.kind);
    const int32_t task = is_gemm_kind(kind) ? e.detail : -1;
    TraceSummary::Row& row = rows[{e.kind, task}];
    row.kind = kind;
    row.task = task;
    const double us = static_cast<double>(e.end_ns - e.begin_ns) * 1e-3;
    ++row.count;
    row.total_us += us;
    auto& [cycles, ns] = cycles_and_ns[{e.kind, task}];
    cycles += static_cast<double>(e.cycles);
    ns += static_cast<double>(e.end_ns - e.begin_ns);
    if (kind == TraceKind::kMainloop) {
      mainloop_cycles += static_cast<double>(e.cycles);
      mainloop_ns += static_cast<double>(e.end_ns - e.begin_ns);
    }
    row.max_us = std::max(row.max_us, us);
    if (kind == TraceKind::kMainloop) s.mainloop_share += us;
    // The signaler runs beside the consumers: its events are not consumer time.
    const bool consumer = kind == TraceKind::kMainloop || kind == TraceKind::kEpilogue || kind == TraceKind::kHandoff;
    if (consumer && kind != TraceKind::kMainloop) s.epilogue_share += us;
    if (consumer) {
      busy[{e.rank, e.cta}].push_back({e.begin_ns, e.end_ns});
    }
  }
  for (auto& [key, row] : rows) {
    row.mean_us = row.total_us / static_cast<double>(row.count);
    const auto& [cycles, ns] = cycles_and_ns[key];
    row.mean_kcycles = cycles / static_cast<double>(row.count) * 1e-3;
    row.mhz = ns > 0 ? cycles / ns * 1e3 : 0;
    s.rows.push_back(row);
  }
  s.mainloop_mhz = mainloop_ns > 0 ? mainloop_cycles / mainloop_ns * 1e3 : 0;
  s.gemm_ctas = static_cast<int>(busy.size());
  if (s.gemm_ctas == 0 || s.span_us <= 0) return s;
  double head = 0, gap = 0, tail = 0;
  for (auto& [key, intervals] : busy) {
    std::sort(intervals.begin(), intervals.end());
    head += static_cast<double>(intervals.front().first - first) * 1e-3;
    tail += static_cast<double>(last - intervals.back().second) * 1e-3;
    for (size_t i = 1; i < intervals.size(); ++i) {
      if (intervals[i].first > intervals[i - 1].second) {
        gap += static_cast<double>(intervals[i].first - intervals[i - 1].second) * 1e-3;
      }
    }
  }
  const double whole = s.span_us * s.gemm_ctas;
  s.mainloop_share /= whole;
  s.epilogue_share /= whole;
  s.head_share = head / whole;
  s.gap_share = gap / whole;
  s.tail_share = tail / whole;
  return s;
}

std::string describe(const TraceSummary& s) {
  std::string text;
  char line[256];
  std::snprintf(line, sizeof(line), "pass span %.1f us; %d GEMM CTAs: mainloop %.1f%%, epilogue %.1f%%, "
                "before first task %.1f%%, between tasks %.1f%%, after last task %.1f%%; "
                "SM clock in the mainloops %.0f MHz\n",
                s.span_us, s.gemm_ctas, 100 * s.mainloop_share, 100 * s.epilogue_share, 100 * s.head_share,
                100 * s.gap_share, 100 * s.tail_share, s.mainloop_mhz);
  text += line;
  std::snprintf(line, sizeof(line), "  %-14s %-15s %8s %12s %10s %10s %10s %6s\n", "event", "task", "count",
                "total us", "mean us", "max us", "mean kcyc", "MHz");
  text += line;
  for (const TraceSummary::Row& r : s.rows) {
    std::snprintf(line, sizeof(line), "  %-14s %-15s %8lld %12.1f %10.2f %10.2f %10.1f %6.0f\n",
                  trace_kind_name(r.kind), r.task >= 0 ? trace_task_name(static_cast<TraceTask>(r.task)) : "-",
                  static_cast<long long>(r.count), r.total_us, r.mean_us, r.max_us, r.mean_kcycles, r.mhz);
    text += line;
  }
  return text;
}

}  // namespace mok
