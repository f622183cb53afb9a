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
  const auto schedule = build_schedule(layer.config, routing, ScheduleOptions{});
  ReferenceOptions options;
  options.num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return relative_l2_error(out, reference_forward(layer.inputs(), schedule, options).out);
}

}  // namespace mok::test_support
