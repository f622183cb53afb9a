// Timing the fused forward on the GPU, and the paired rounds that compare
// option sets on the same data: the machinery mok_cli --compare and
// mok_cli tune share (CUDA builds only).
//
// Why paired rounds: the H200 moves its clock with the power cap, so times
// taken minutes apart are not comparable; times taken in the same round, in
// turn, are. Only ratios within a round count, and the median over rounds
// keeps one disturbed round from deciding.
#pragma once

#include <cmath>
#include <functional>
#include <span>
#include <vector>

#include "mok/fused_forward.hpp"

namespace mok::tools {

struct ForwardTiming {
  double pass_ms;          // median of single passes, each timed alone (the host's enqueue counts)
  double back_to_back_ms;  // mean over passes enqueued back to back (the host runs ahead, as in training)
  double enqueue_us;       // median host time of one run() call
  double fastest_ms = NAN;  // the fastest and the slowest single pass: a spread far wider than
  double slowest_ms = NAN;  // the medians' says the passes are bimodal, not noisy
};

// Three warm-up passes, then `iterations` passes timed alone and
// `iterations` enqueued back to back (CUDA events); checks the passes.
ForwardTiming time_forward(FusedForward& forward, const std::vector<RankTensors>& tensors, int iterations);

// `warmup` passes, then the mean time of `iterations` passes enqueued back
// to back (what python -m mok.tune times); checks the passes.
double time_back_to_back(FusedForward& forward, const std::vector<RankTensors>& tensors, int iterations,
                         int warmup);

// One timing of one forward in one round.
struct Visit {
  int round;
  size_t index;  // into the forwards given to paired_rounds
  ForwardTiming timing;
};

// `rounds` rounds, each timing every forward once, in the order given, with
// `timer`; `mirrored` rounds then time them again in reverse order (a b b a
// for two), so that a clock drifting steadily within a round favours none
// (python -m mok.tune's order). on_visit sees each timing as it is taken.
std::vector<Visit> paired_rounds(std::span<FusedForward* const> forwards, int rounds, bool mirrored,
                                 const std::function<ForwardTiming(FusedForward&)>& timer,
                                 const std::function<void(const Visit&)>& on_visit = {});

// Per round: the sum of `field` over forward `numerator`'s visits of that
// round / the same sum for forward `denominator`.
std::vector<double> round_ratios(const std::vector<Visit>& visits, size_t numerator, size_t denominator,
                                 double ForwardTiming::*field);

// The median (the mean of the middle two for an even count, as Python's
// statistics.median); 0 for none.
double median(std::vector<double> values);

}  // namespace mok::tools
