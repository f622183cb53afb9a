// The weight-gradient task list: one task per (group, m-tile, n-tile) of the
// fp32 output out[G][m][n], groups in order, n-tile fastest. The task count
// is fixed by the shape (an empty group still has its tiles: they store
// zeros), so the host knows it without reading the group sizes; each task's
// K range -- the group's rows -- is read when the walk reaches it.
// CTA b of a grid of P takes tasks b, b + P, ... (producer and consumers
// each own a walker with the same (first, stride)). The order never changes
// a result: a tile's sum depends only on its group's rows.
#pragma once

#include <cstdint>

#include "plan/tile_task_cursor.hpp"

namespace mok::device {

struct WeightGradTile {
  int group;
  int m0;    // first output row of the tile (a column of a)
  int n0;    // first output column (a column of b)
  int row0;  // the group's first row in a and b: K starts here
  int rows;  // the group's rows (K); 0: the tile is zeros
};

template <int kBlockM, int kBlockN>
struct WeightGradTileWalker {
  const int32_t* group_offset;  // [G + 1]
  const int32_t* group_rows;    // [G]
  int num_groups;
  // The next task's place: made once here (the walk's only divisions), then
  // moved by the stride's digits (plan/tile_task_cursor.hpp). The list ends
  // where the place's group does.
  plan::TileTaskCursor place;

  __device__ WeightGradTileWalker(const int32_t* offset, const int32_t* rows, int groups, int m_tiles, int n_tiles,
                                  int first, int stride)
      : group_offset(offset),
        group_rows(rows),
        num_groups(groups),
        place(plan::TileTaskCursor::at(first, stride, m_tiles, n_tiles)) {}

  __device__ bool next(WeightGradTile& tile) {
    if (place.group >= num_groups) return false;
    tile.group = place.group;
    tile.m0 = place.m * kBlockM;
    tile.n0 = place.n * kBlockN;
    tile.row0 = group_offset[place.group];
    tile.rows = max(group_rows[place.group], 0);
    place.advance();
    return true;
  }
};

}  // namespace mok::device
