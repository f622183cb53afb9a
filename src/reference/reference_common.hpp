// What the reference's forward and backward share besides the math: input
// checks, the walk over the schedule, and a fixed-partition thread pool.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "mok/reference.hpp"
#include "reference/layer_math.hpp"

namespace mok::ref {

// Throws mok::Error unless config, routing (with weights), weight pointers,
// options and the schedule all fit together: the schedule must have R ranks,
// top_k = k, every rank's expert blocks in bounds, every real row naming a
// (rank, token, slot) routed to the expert whose block holds it, and
// combine_row pointing back at that row for every entry (so rows and entries
// match one to one).
void validate_reference(const LayerInputs& inputs, const WorldSchedule& schedule,
                        const ReferenceOptions& options, bool fp8_allowed = false);

// The real rows of global expert `expert`, in schedule order (padding left out).
std::span<const RowSource> expert_rows(const WorldSchedule& schedule, const LayerConfig& config,
                                       int expert);

// The weights of routed expert `expert`, or of the shared expert.
FfnWeights routed_weights(const LayerInputs& inputs, int expert);
FfnWeights shared_weights(const LayerInputs& inputs);

// body(begin, end) over [0, count) cut into one contiguous block per thread.
// The body must write only outputs owned by its indices; then the result
// cannot depend on `threads`. Runs inline when threads <= 1 or count is small.
void parallel_for(int threads, int64_t count, const std::function<void(int64_t, int64_t)>& body);

// Widens a T buffer to the double vectors of the public result.
template <typename T>
std::vector<double> to_double(const std::vector<T>& values) {
  return std::vector<double>(values.begin(), values.end());
}

}  // namespace mok::ref
