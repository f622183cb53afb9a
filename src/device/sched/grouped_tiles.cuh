// The grouped-GEMM task list and the walker every role uses to traverse it.
//
// Task space: groups in order; inside group g, ceil(rows[g] / BM) row tiles
// times n_tiles column tiles of kBlockCols output columns, visited in bands:
// up to `band` row tiles at a time, row tile fastest inside a band, then the
// next column tile, then the next band. Neighbouring tasks (which run at the
// same time on neighbouring CTAs) thus share weight columns, and a large group
// keeps only `band` row tiles of A live in L2 instead of all of them.
// Tasks are numbered 0, 1, ... in that order; CTA b of a grid of P takes
// tasks b, b + P, b + 2P, ... (every task costs the same K loop, so static
// striding balances without atomics). Group sizes are read from memory (a
// shared-memory copy when the kernel made one) as the walk reaches them: the
// host never needs them.
//
// Producer and consumers each own a walker with the same (first, stride), so
// they see the same task sequence by construction. The order never changes a
// result: each task's output depends only on its rows and weights.
#pragma once

#include <cstdint>

namespace mok::device {

// One task: one output tile of one group's rows.
struct GemmTile {
  int group;
  int row0;     // first A / output row of the tile (absolute row index)
  int row_end;  // rows [row0, row_end) are this group's real rows: the only ones written
  int n0;       // first output column of the tile
};

template <int kBlockM, int kBlockCols>
struct GroupedTileWalker {
  const int32_t* group_offset;  // [num_groups + 1] padded start rows (global or shared)
  const int32_t* group_rows;    // [num_groups] real rows (global or shared)
  int num_groups;
  int n_tiles;     // column tiles per group
  int band;        // row tiles per band (>= 1)
  int m_total;     // rows of A / out; nothing at or past it is written
  int next_task;   // next task index this walker will return
  int stride;      // tasks between consecutive returns

  int group = -1;          // current group
  int group_first = 0;     // first task of the current group
  int group_end = 0;       // one past its last task
  int group_m_tiles = 0;   // its row tiles
  int group_row0 = 0;      // its first row
  int group_row_end = 0;   // one past its last real row, clamped to m_total

  // Returns false once the task list is exhausted.
  __device__ bool next(GemmTile& tile) {
    const int task = next_task;
    next_task += stride;
    while (task >= group_end) {
      if (++group >= num_groups) return false;
      const int rows = group_rows[group];
      const int offset = group_offset[group];
      group_first = group_end;
      group_m_tiles = rows > 0 ? (rows + kBlockM - 1) / kBlockM : 0;
      group_end = group_first + group_m_tiles * n_tiles;
      group_row0 = offset;
      group_row_end = min(offset + max(rows, 0), m_total);
    }
    const int local = task - group_first;
    const int band_index = local / (band * n_tiles);
    const int band_first = band_index * band;
    const int band_rows = min(band, group_m_tiles - band_first);
    const int in_band = local - band_first * n_tiles;
    const int m_tile = band_first + in_band % band_rows;
    const int n_tile = in_band / band_rows;
    tile.group = group;
    tile.row0 = group_row0 + m_tile * kBlockM;
    tile.row_end = min(tile.row0 + kBlockM, group_row_end);
    tile.n0 = n_tile * kBlockCols;
    return true;
  }
};

}  // namespace mok::device
