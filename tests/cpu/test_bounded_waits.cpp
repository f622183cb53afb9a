// The two deadlines of a counter wait (src/protocol/counters.hpp), on host
// threads: a wait that counts from its start gives up on a counter that keeps
// moving but arrives late; one that counts from the counter's last move (the
// backward's combine) waits it out; both give up, with a report, on a counter
// that stops.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>

#include "protocol/counters.hpp"
#include "protocol/host_sync.hpp"

namespace {

using mok::protocol::AbortView;
using mok::protocol::CounterId;
using mok::protocol::Deadline;
using mok::protocol::HostSync;
using mok::protocol::StallReport;
using mok::protocol::wait_at_least;

struct Words {
  uint32_t counter = 0;
  uint32_t abort = 0;
  StallReport stall{};
  AbortView view() { return {&abort, &stall}; }
};

// Adds 1 to the counter every `every`, `times` times, then stops.
std::thread ticker(uint32_t* counter, std::chrono::milliseconds every, int times) {
  return std::thread([=] {
    for (int i = 0; i < times; ++i) {
      std::this_thread::sleep_for(every);
      HostSync::add_release(counter, 1u);
    }
  });
}

constexpr auto kTimeout = std::chrono::milliseconds(100);
constexpr auto kEvery = std::chrono::milliseconds(5);  // 20x under the timeout: a loaded machine stays under it
constexpr int kTicks = 60;                             // ~300 ms in all: three timeouts

TEST(BoundedWaits, FromProgressWaitsOutACounterThatKeepsMoving) {
  Words w;
  HostSync sync(kTimeout);
  std::thread t = ticker(&w.counter, kEvery, kTicks);
  const bool ok = wait_at_least<Deadline::kFromProgress>(sync, w.view(), &w.counter, kTicks, CounterId::kDxDone, 0, 1, 0);
  t.join();
  EXPECT_TRUE(ok);
  EXPECT_EQ(w.abort, 0u);
  EXPECT_EQ(w.stall.counter, 0u);
}

TEST(BoundedWaits, FromStartGivesUpOnTheSameCounter) {
  Words w;
  HostSync sync(kTimeout);
  std::thread t = ticker(&w.counter, kEvery, kTicks);
  const bool ok = wait_at_least(sync, w.view(), &w.counter, kTicks, CounterId::kDxDone, 0, 1, 0);
  t.join();
  EXPECT_FALSE(ok);
  EXPECT_EQ(w.abort, 1u);
  EXPECT_EQ(static_cast<CounterId>(w.stall.counter), CounterId::kDxDone);
  EXPECT_LT(w.stall.observed, static_cast<uint32_t>(kTicks));
}

TEST(BoundedWaits, FromProgressGivesUpWithAReportWhenTheCounterStops) {
  Words w;
  HostSync sync(kTimeout);
  std::thread t = ticker(&w.counter, kEvery, 5);  // stops at 5 of 60
  const auto start = std::chrono::steady_clock::now();
  const bool ok = wait_at_least<Deadline::kFromProgress>(sync, w.view(), &w.counter, kTicks, CounterId::kDxDone, 0, 1, 7);
  t.join();
  EXPECT_FALSE(ok);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(w.abort, 1u);
  EXPECT_EQ(static_cast<CounterId>(w.stall.counter), CounterId::kDxDone);
  EXPECT_EQ(w.stall.observed, 5u);
  EXPECT_EQ(w.stall.target, static_cast<uint32_t>(kTicks));
  EXPECT_EQ(w.stall.owner, 1);
  EXPECT_EQ(w.stall.index, 7);
}

}  // namespace
