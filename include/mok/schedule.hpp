// The deterministic schedule of one forward/backward pass, for every rank of
// the world: what each rank receives, in which order, and where each
// (token, slot) result lives for the combine. The rule itself is written once
// in src/plan/schedule_rules.hpp; docs/architecture.md explains it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mok/layer_config.hpp"
#include "mok/routing.hpp"
#include "mok/row_source.hpp"

namespace mok {

struct ScheduleOptions {
  int tile_rows = 128;  // each expert's rows are padded to a multiple of this (>= 1)
  int num_threads = 1;  // host threads building receivers; never changes the result
};

// What one receiver rank computes.
struct RankSchedule {
  int rank = 0;
  int first_expert = 0;       // global id of local expert 0
  int num_local_experts = 0;  // El = E / R
  int tile_rows = 1;
  std::vector<int32_t> expert_rows;    // [El] real rows of each local expert
  std::vector<int32_t> expert_offset;  // [El + 1] padded start rows; back() = padded total
  std::vector<RowSource> rows;         // [padded total] in schedule order

  int32_t padded_rows() const { return expert_offset.empty() ? 0 : expert_offset.back(); }
};

struct WorldSchedule {
  int top_k = 0;
  std::vector<RankSchedule> ranks;  // [R], by receiver rank
  // combine_row[home][token * top_k + slot] = row index, in the schedule of the
  // rank that owns expert_ids[token][slot], where that entry's result is made.
  std::vector<std::vector<int32_t>> combine_row;
};

// Validates config and routing ids first (weights are not read).
WorldSchedule build_schedule(const LayerConfig& config, std::span<const RankRouting> routing,
                             const ScheduleOptions& options = {});

}  // namespace mok
