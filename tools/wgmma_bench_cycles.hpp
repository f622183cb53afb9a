// mok_wgmma_bench's host side of a timed launch: each CTA's consumer
// warpgroups write their clock64 spans to cycles[2 * cta + warpgroup]; these
// read them back and sum them up.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "common/cuda_check.hpp"

namespace mok::tools {

// The spans of warpgroup `which` (0 or 1; -1: both) over every CTA, each
// divided by `units` (stages or tiles), sorted ascending. Waits for the launch.
inline std::vector<double> read_spans(const long long* cycles, int ctas, int which, int units) {
  std::vector<long long> host(2 * static_cast<size_t>(ctas));
  MOK_CUDA_CHECK(cudaMemcpy(host.data(), cycles, sizeof(long long) * host.size(), cudaMemcpyDeviceToHost));
  std::vector<double> spans;
  for (size_t i = 0; i < host.size(); ++i) {
    if (which < 0 || static_cast<int>(i % 2) == which) spans.push_back(static_cast<double>(host[i]) / units);
  }
  std::sort(spans.begin(), spans.end());
  return spans;
}

inline double median_of(const std::vector<double>& sorted) { return sorted[sorted.size() / 2]; }

}  // namespace mok::tools
