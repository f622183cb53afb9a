// The pass-trace summary on hand-built timelines.
#include <gtest/gtest.h>

#include <vector>

#include "mok/pass_trace.hpp"

namespace {

// Every event here runs at 1.5 GHz: 1.5 cycles per ns.
mok::TraceEvent event(mok::TraceKind kind, int cta, uint64_t begin, uint64_t end, int detail = 0) {
  mok::TraceEvent e{};
  e.begin_ns = begin;
  e.end_ns = end;
  e.cycles = static_cast<uint32_t>((end - begin) * 3 / 2);
  e.detail = detail;
  e.cta = static_cast<uint16_t>(cta);
  e.rank = 0;
  e.kind = static_cast<uint8_t>(kind);
  return e;
}

TEST(PassTrace, EmptyTraceSummarisesToNothing) {
  const mok::TraceSummary s = mok::summarize_trace({});
  EXPECT_EQ(s.span_us, 0);
  EXPECT_EQ(s.gemm_ctas, 0);
  EXPECT_TRUE(s.rows.empty());
}

TEST(PassTrace, SharesOfTheGemmConsumersAddUpToTheSpan) {
  using K = mok::TraceKind;
  const int gate_up = static_cast<int>(mok::TraceTask::kGateUp), down = static_cast<int>(mok::TraceTask::kDown);
  // Span 0..10000 ns. CTA 1: head 1000, mainloop 3000, epilogue 1000, gap 1000,
  // mainloop 2000, epilogue 1000, tail 1000. CTA 2: one 10000 ns mainloop.
  // CTA 0 (dispatch) sets the span's start.
  const std::vector<mok::TraceEvent> events = {
      event(K::kSchedule, 0, 0, 500),
      event(K::kMainloop, 1, 1000, 4000, gate_up), event(K::kEpilogue, 1, 4000, 5000, gate_up),
      event(K::kMainloop, 1, 6000, 8000, down),    event(K::kEpilogue, 1, 8000, 8700, down),
      event(K::kHandoff, 1, 8700, 9000, down),
      event(K::kSignal, 1, 9000, 9400, down),  // the signaler, beside the consumers: not consumer time
      event(K::kMainloop, 2, 0, 10000, gate_up),
  };
  const mok::TraceSummary s = mok::summarize_trace(events);
  EXPECT_DOUBLE_EQ(s.span_us, 10.0);
  EXPECT_EQ(s.gemm_ctas, 2);
  EXPECT_DOUBLE_EQ(s.mainloop_share, 15.0 / 20.0);
  EXPECT_DOUBLE_EQ(s.epilogue_share, 2.0 / 20.0);
  EXPECT_DOUBLE_EQ(s.head_share, 1.0 / 20.0);
  EXPECT_DOUBLE_EQ(s.gap_share, 1.0 / 20.0);
  EXPECT_DOUBLE_EQ(s.tail_share, 1.0 / 20.0);
  EXPECT_NEAR(s.mainloop_share + s.epilogue_share + s.head_share + s.gap_share + s.tail_share, 1.0, 1e-12);

  bool saw_gate_up_mainloop = false;
  for (const auto& row : s.rows) {
    if (row.kind == K::kMainloop && row.task == gate_up) {
      saw_gate_up_mainloop = true;
      EXPECT_EQ(row.count, 2);
      EXPECT_DOUBLE_EQ(row.total_us, 13.0);
      EXPECT_DOUBLE_EQ(row.mean_us, 6.5);
      EXPECT_DOUBLE_EQ(row.max_us, 10.0);
      EXPECT_DOUBLE_EQ(row.mean_kcycles, 6.5 * 1.5);
      EXPECT_DOUBLE_EQ(row.mhz, 1500.0);
    }
    if (row.kind == K::kSchedule) EXPECT_EQ(row.task, -1);
  }
  EXPECT_TRUE(saw_gate_up_mainloop);
  EXPECT_DOUBLE_EQ(s.mainloop_mhz, 1500.0);
  EXPECT_NE(mok::describe(s).find("gate/up"), std::string::npos);
}

}  // namespace
