// The fused forward's output against the CPU reference, as one relative L2
// error over every rank's tokens (unwritten NaN outputs count as huge errors).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "mok/bf16.hpp"
#include "mok/reference.hpp"
#include "mok/schedule.hpp"
#include "mok/synthetic.hpp"

namespace mok::test_support {

inline double relative_error_to_reference(const std::vector<uint16_t>& out, const synthetic::Layer& layer) {
  const auto routing = layer.routing();
  const auto schedule = build_schedule(layer.config, routing, {128, 1});
  ReferenceOptions options;
  options.num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto ref = reference_forward(layer.inputs(), schedule, options);
  double err2 = 0, ref2 = 0;
  size_t at = 0;
  for (const auto& rank : ref.out) {
    for (double v : rank) {
      const double d = bf16_bits_to_float(out.at(at++)) - v;
      err2 += std::isnan(d) ? 1e30 : d * d;
      ref2 += v * v;
    }
  }
  return std::sqrt(err2 / std::max(ref2, 1e-30));
}

}  // namespace mok::test_support
