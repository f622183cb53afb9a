// What every workspace layout must satisfy, for the CPU tests of the
// forward's (test_workspace_layout.cpp) and the backward's
// (test_backward_layout.cpp): regions on the workspace's boundary, disjoint,
// inside the allocation, whose size is itself on the boundary.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "world/workspace_layout.hpp"

namespace mok::test_support {

inline void expect_aligned_disjoint_and_inside(std::vector<world::NamedRegion> all, size_t bytes) {
  // By offset, an empty region before a full one at the same offset (an
  // empty region, e.g. a bf16 layer's FP8 scales, takes no bytes).
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return a.region.offset != b.region.offset ? a.region.offset < b.region.offset : a.region.end() < b.region.end();
  });
  size_t end = 0;
  for (const auto& named : all) {
    SCOPED_TRACE(named.name);
    EXPECT_EQ(named.region.offset % world::kRegionAlignment, 0u);
    EXPECT_GE(named.region.offset, end) << "overlaps the region before it";
    end = named.region.end();
  }
  EXPECT_LE(end, bytes);
  EXPECT_EQ(bytes % world::kRegionAlignment, 0u);
}

}  // namespace mok::test_support
