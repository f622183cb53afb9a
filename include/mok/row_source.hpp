// Where one row of an expert's input comes from. Plain data: shared by the
// host planner, the CPU reference and device code.
#pragma once

#include <cstdint>

namespace mok {

struct RowSource {
  int32_t rank;   // home rank of the token, or kPaddingRank for a padding row
  int32_t token;  // token index on that rank
  int32_t slot;   // top-k slot j with expert_ids[token][j] == this expert
};

inline constexpr int32_t kPaddingRank = -1;

inline constexpr RowSource padding_row() { return RowSource{kPaddingRank, -1, -1}; }
inline constexpr bool is_padding(const RowSource& row) { return row.rank == kPaddingRank; }

}  // namespace mok
