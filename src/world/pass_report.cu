#include "world/pass_report.hpp"

#include <cstring>
#include <string>

#include "common/cuda_check.hpp"
#include "mok/error.hpp"
#include "protocol/world_barrier.hpp"
#include "world/device_scope.hpp"

namespace mok::world {
namespace {

using std::to_string;

}  // namespace

void throw_if_barrier_broke(WorldCore& core, std::span<const size_t> barrier_offset, double timeout_seconds,
                            const std::string& what, const std::string& options) {
  for (int r = 0; r < core.world_size; ++r) {
    uint8_t* memory = core.rank_memory[static_cast<size_t>(r)];
    if (memory == nullptr) continue;
    protocol::WorldBarrierWords words;
    {
      DeviceScope on(core.rank_device[static_cast<size_t>(r)]);
      MOK_CUDA_CHECK(cudaMemcpy(&words, memory + barrier_offset[static_cast<size_t>(r)], sizeof(words),
                                cudaMemcpyDeviceToHost));
    }
    if (words.broken == 0) continue;
    core.broken = true;
    const protocol::StallReport& report = words.stall;
    const bool start = report.counter == static_cast<uint32_t>(protocol::CounterId::kWorldStarted);
    throw Error(what + ": rank " + to_string(report.waiter) + " waited " + to_string(timeout_seconds) +
                " s for rank " + to_string(report.owner) + " to " + (start ? "start" : "finish") + " pass " +
                to_string(report.target) + " (it had " + (start ? "started" : "finished") + " pass " +
                to_string(report.observed) + "). Every rank must run every pass (the same number of run() calls), "
                "on a GPU it has to itself; this world object cannot run further passes (" + options + ")");
  }
}

PassReport read_report_at(const WorldCore& core, const uint32_t* abort, const protocol::StallReport* stall) {
  PassReport report;
  DeviceScope on(core.report_device());
  MOK_CUDA_CHECK(cudaMemcpy(&report.abort, abort, sizeof(uint32_t), cudaMemcpyDefault));
  MOK_CUDA_CHECK(cudaMemcpy(&report.stall, stall, sizeof(report.stall), cudaMemcpyDefault));
  return report;
}

namespace {

[[noreturn]] void throw_report(const WorldState& s, const protocol::StallReport& report) {
  const auto id = static_cast<protocol::CounterId>(report.counter);
  if (id == protocol::CounterId::kBadWeight) {
    const int k = s.config.top_k;
    float weight;
    std::memcpy(&weight, &report.observed, sizeof(weight));
    throw Error("fused forward: rank " + to_string(report.waiter) + ", token " + to_string(report.index / k) +
                ", slot " + to_string(report.index % k) + ": routing weight " + to_string(weight) +
                " is not finite (NaN and infinite weights are refused)");
  }
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

}  // namespace

PassReport read_pass_report(const WorldState& s) {
  if (!s.device_ordered()) return s.read_report_words();
  PassReport report;
  DeviceScope on(s.report_device());
  if (s.epoch == 0) return report;
  if (s.rank_base[0] == nullptr) {
    if (s.report_at_close) return *s.report_at_close;
    throw Error("check: rank 0's workspace is not mapped in this process (call import_peers() first)");
  }
  const int set = protocol::counter_set_of(s.epoch);
  const protocol::ForwardCounters rank0 = protocol::carve_counters(
      s.layouts[0].geometry, reinterpret_cast<uint32_t*>(s.rank_base[0] + s.layouts[0].counters[set].offset));
  return read_report_at(s, rank0.abort, rank0.stall);
}

void throw_if_aborted(WorldState& s) {
  if (s.device_ordered()) {
    if (s.epoch == 0) return;
    std::vector<size_t> barrier_offset;
    for (const RankLayout& L : s.layouts) barrier_offset.push_back(L.barrier.offset);
    throw_if_barrier_broke(s, barrier_offset, s.options.barrier_timeout_seconds, "fused forward",
                           s.options.describe());
  }
  const PassReport report = read_pass_report(s);
  if (report.abort != 0) throw_report(s, report.stall);
}

}  // namespace mok::world
