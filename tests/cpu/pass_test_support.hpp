// What the CPU checks of pass tables share: which local expert a piece of
// work belongs to, given where each expert's schedule m-tiles start.
#pragma once

#include <cstdint>
#include <vector>

#include "protocol/counters.hpp"
#include "protocol/pass_table.hpp"

namespace mok::protocol::test_support {

// `first` ([El + 1]): each local expert's first schedule m-tile (empty for a
// pass without per-expert work: then no work names an expert).
template <class P>
ExpertOfWork expert_of_work(const PassGeometry<P>& g, const std::vector<int32_t>& first, int32_t kind,
                            int32_t m_tile) {
  ExpertOfWork of;
  if (first.empty() || kind < 0) return of;
  if (P::kKinds[kind].rows == Rows::kExpert) {
    of.expert = expert_of_task(g, Task{kind, -1, m_tile, 0});
  } else if (P::kKinds[kind].rows == Rows::kSchedule) {
    while (of.expert + 2 < static_cast<int32_t>(first.size()) && first[static_cast<size_t>(of.expert + 1)] <= m_tile) {
      ++of.expert;
    }
  } else {
    return of;
  }
  of.schedule_m_tiles = first[static_cast<size_t>(of.expert + 1)] - first[static_cast<size_t>(of.expert)];
  return of;
}

// A kind of schedule rows (what a dispatch of an m-tile feeds), or -1.
template <class P>
constexpr int32_t first_schedule_kind() {
  for (int32_t k = 0; k < P::kNumKinds; ++k) {
    if (P::kKinds[k].rows == Rows::kSchedule) return k;
  }
  return -1;
}

}  // namespace mok::protocol::test_support
