// The weight-gradient walk's place kept in the task list's digits
// (plan/tile_task_cursor.hpp): every task a CTA visits, stepping by the
// grid's size with carries, is the task the divisions give, and the walk
// ends exactly where the group passes the last one.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "plan/tile_task_cursor.hpp"

namespace {

using mok::plan::TileTaskCursor;

// (group, m, n) of `task` by division, as the walk computed it before.
std::tuple<int, int, int> place_of(int task, int m_tiles, int n_tiles) {
  const int per_group = m_tiles * n_tiles;
  const int group = task / per_group;
  const int local = task % per_group;
  return {group, local / n_tiles, local % n_tiles};
}

TEST(TileTaskCursor, EveryStepLandsOnTheTaskTheDivisionsGive) {
  // Shapes of the DeepSeek-V3 slice's dW13 and dW2 (32 groups, 32 x 28 and
  // 56 x 8 tiles), small and odd ones, single tiles, with grids of one CTA,
  // fewer CTAs than a row of tiles, the H200's 132 and more than a group.
  const std::vector<std::tuple<int, int, int>> shapes = {
      {32, 32, 28}, {32, 56, 8}, {3, 5, 7}, {1, 1, 1}, {7, 1, 3}, {5, 4, 1}, {160, 12, 20}, {2, 64, 64}};
  const std::vector<int> grids = {1, 2, 3, 5, 27, 28, 29, 132, 1000, 5000};
  for (const auto& [groups, m_tiles, n_tiles] : shapes) {
    const int tasks = groups * m_tiles * n_tiles;
    for (const int grid : grids) {
      for (int cta = 0; cta < grid && cta < tasks + 2; ++cta) {
        TileTaskCursor cursor = TileTaskCursor::at(cta, grid, m_tiles, n_tiles);
        int visited = 0;
        for (int task = cta; task < tasks; task += grid) {
          if (visited > 0) cursor.advance();
          const auto [group, m, n] = place_of(task, m_tiles, n_tiles);
          ASSERT_EQ(cursor.group, group) << "groups " << groups << " tiles " << m_tiles << "x" << n_tiles << " grid "
                                         << grid << " cta " << cta << " task " << task;
          ASSERT_EQ(cursor.m, m) << "task " << task;
          ASSERT_EQ(cursor.n, n) << "task " << task;
          ++visited;
        }
        // One step past the CTA's last task lands past the last group: the
        // walk ends on the group alone (a CTA with no task starts there).
        if (visited > 0) cursor.advance();
        EXPECT_GE(cursor.group, groups) << "grid " << grid << " cta " << cta;
      }
    }
  }
}

TEST(TileTaskCursor, CarriesRunFromTheNTileThroughTheMTileIntoTheGroup) {
  // 4 x 3 tiles a group (12 tasks). A stride of 12 keeps (m, n) and steps
  // the group. A stride of 20 is (1 group, 2 m, 2 n): from (0, 3, 1) the
  // n-tile carries (1 + 2 = 3), then the m-tile (3 + 2 + 1 = 6), so the
  // group moves by two.
  TileTaskCursor a = TileTaskCursor::at(5, 12, 4, 3);
  a.advance();
  EXPECT_EQ(std::make_tuple(a.group, a.m, a.n), std::make_tuple(1, 1, 2));
  TileTaskCursor b = TileTaskCursor::at(10, 20, 4, 3);
  EXPECT_EQ(std::make_tuple(b.group, b.m, b.n), std::make_tuple(0, 3, 1));
  b.advance();
  EXPECT_EQ(std::make_tuple(b.group, b.m, b.n), std::make_tuple(2, 2, 0));
  EXPECT_EQ(std::make_tuple(b.group, b.m, b.n), place_of(30, 4, 3));
}

}  // namespace
