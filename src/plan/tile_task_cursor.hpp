// A CTA's place in a task list laid out as (group, m-tile, n-tile), n-tile
// fastest, walked with a fixed stride (CTA b of P takes tasks b, b + P, ...:
// the grouped weight gradient's list, device/sched/weight_grad_tiles.cuh).
// The place is kept in the list's own digits and moved by the stride's
// digits with carries, so that only the first task costs divisions (between
// two weight-gradient tiles the next place used to take two runtime integer
// divisions; timed on an H200 the change was below the runs' spread,
// docs/perf-notes.md v10: it is kept as the simpler walk). Plain integer
// code, shared by the kernels and the CPU tests.
#pragma once

#include "common/host_device.hpp"

namespace mok::plan {

struct TileTaskCursor {
  int group = 0, m = 0, n = 0;                       // the current task: (group * m_tiles + m) * n_tiles + n
  int stride_group = 0, stride_m = 0, stride_n = 0;  // the stride in the same digits
  int m_tiles = 1, n_tiles = 1;

  // At task `task`, stepping by `stride` (both >= 0; m_tiles, n_tiles >= 1).
  MOK_HD static TileTaskCursor at(int task, int stride, int m_tiles, int n_tiles) {
    TileTaskCursor c;
    c.m_tiles = m_tiles;
    c.n_tiles = n_tiles;
    const int per_group = m_tiles * n_tiles;
    c.group = task / per_group;
    const int local = task - c.group * per_group;
    c.m = local / n_tiles;
    c.n = local - c.m * n_tiles;
    c.stride_group = stride / per_group;
    const int stride_local = stride - c.stride_group * per_group;
    c.stride_m = stride_local / n_tiles;
    c.stride_n = stride_local - c.stride_m * n_tiles;
    return c;
  }

  // The task `stride` further on. Each digit plus the stride's digit plus a
  // carry stays below twice its radix, so one subtraction carries it.
  MOK_HD void advance() {
    n += stride_n;
    const int carry_n = n >= n_tiles ? 1 : 0;
    n -= carry_n * n_tiles;
    m += stride_m + carry_n;
    const int carry_m = m >= m_tiles ? 1 : 0;
    m -= carry_m * m_tiles;
    group += stride_group + carry_m;
  }
};

}  // namespace mok::plan
