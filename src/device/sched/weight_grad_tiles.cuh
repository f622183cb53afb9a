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
  int m_tiles;
  int n_tiles;
  int num_tasks;  // G * m_tiles * n_tiles
  int next_task;
  int stride;

  __device__ bool next(WeightGradTile& tile) {
    if (next_task >= num_tasks) return false;
    const int task = next_task;
    next_task += stride;
    const int per_group = m_tiles * n_tiles;
    const int group = task / per_group;
    const int local = task - group * per_group;
    tile.group = group;
    tile.m0 = (local / n_tiles) * kBlockM;
    tile.n0 = (local % n_tiles) * kBlockN;
    tile.row0 = group_offset[group];
    tile.rows = max(group_rows[group], 0);
    return true;
  }
};

}  // namespace mok::device
