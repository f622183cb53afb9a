// The deterministic schedule as plain functions over caller-owned arrays: no
// STL, no allocation, no exceptions (MOK_HD). The host planner runs them; the
// fused kernels build the same rule in their own parallel form
// (src/device/roles/schedule_role.cuh), checked through its results.
//
// The rule. Receiver rank r owns experts [first_expert, first_expert + El).
// Each local expert's rows are the (rank, token, slot) entries routed to it,
// ordered by (home rank, token) ascending: that is global token order, so the
// order -- and any reduction over rows in that order -- is the same for every
// EP degree that splits the same global batch. A token meets an expert at
// most once (validation forbids duplicates), so the key is unique. Each
// expert's block is padded at its end to a multiple of tile_rows; an empty
// expert takes no rows at all.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"
#include "mok/row_source.hpp"

namespace mok::plan {

// One rank's routing ids as the schedule sees them: [tokens, top_k] row-major.
struct RoutingIds {
  const int32_t* ids;
  int tokens;
};

MOK_HD int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// counts[i] = rows that local expert first_expert + i receives from all ranks.
MOK_HD void count_expert_rows(const RoutingIds* world, int world_size, int top_k,
                              int first_expert, int num_local, int32_t* counts) {
  for (int i = 0; i < num_local; ++i) counts[i] = 0;
  for (int r = 0; r < world_size; ++r) {
    const int64_t entries = static_cast<int64_t>(world[r].tokens) * top_k;
    for (int64_t n = 0; n < entries; ++n) {
      const int local = world[r].ids[n] - first_expert;
      if (local >= 0 && local < num_local) ++counts[local];
    }
  }
}

// offsets[i] = padded start row of local expert i; offsets[num_local] = padded
// total, which is also returned.
MOK_HD int64_t padded_offsets(const int32_t* counts, int num_local, int tile_rows,
                              int32_t* offsets) {
  int64_t total = 0;
  for (int i = 0; i < num_local; ++i) {
    offsets[i] = static_cast<int32_t>(total);
    total += round_up(counts[i], tile_rows);
  }
  offsets[num_local] = static_cast<int32_t>(total);
  return total;
}

// Writes rows[offsets[0] .. offsets[num_local]) in schedule order, padding at
// each expert's end. `cursor` is scratch of num_local entries. When
// `combine_row` is not null, combine_row[home][token * top_k + slot] receives
// the row index for every entry this receiver owns (distinct entries per
// receiver, so receivers may fill one shared map concurrently).
MOK_HD void fill_rows(const RoutingIds* world, int world_size, int top_k, int first_expert,
                      int num_local, const int32_t* counts, const int32_t* offsets,
                      int32_t* cursor, RowSource* rows, int32_t* const* combine_row) {
  for (int i = 0; i < num_local; ++i) cursor[i] = offsets[i];
  for (int r = 0; r < world_size; ++r) {
    for (int t = 0; t < world[r].tokens; ++t) {
      for (int j = 0; j < top_k; ++j) {
        const int64_t entry = static_cast<int64_t>(t) * top_k + j;
        const int local = world[r].ids[entry] - first_expert;
        if (local < 0 || local >= num_local) continue;
        const int32_t row = cursor[local]++;
        rows[row] = RowSource{r, t, j};
        if (combine_row != nullptr) combine_row[r][entry] = row;
      }
    }
  }
  for (int i = 0; i < num_local; ++i) {
    for (int32_t row = offsets[i] + counts[i]; row < offsets[i + 1]; ++row) rows[row] = padding_row();
  }
}

}  // namespace mok::plan
