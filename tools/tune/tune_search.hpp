// The tuners' search: the C++ twin of python/mok/tune.py's search() and
// table(), step for step, so that mok_cli tune and python -m mok.tune walk
// the same candidates in the same order and keep the same winner for the
// same measurements (tests/cpu/test_tune_search.cpp runs Python's cost-model
// test on it).
//
// A coordinate walk from `defaults`: each value of each option of the grid,
// in order, set on the best set so far; a candidate is timed against the
// best (compare(candidate, best) = its time / the best's, measured in paired
// rounds) and replaces it only when faster by more than `margin` (the noise).
// The walk repeats over the grid until a full sweep changes nothing or the
// budget is spent; a candidate already timed is never timed again.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tune/option_set.hpp"
#include "tune/tuning_grid.hpp"

namespace mok::tune {

struct Measurement {
  OptionSet options;
  double ratio_to_default;  // time with these options / time with the defaults (< 1: faster)
};

struct SearchResult {
  OptionSet best;
  double speedup = 1.0;  // the defaults' time / the best's
  std::vector<Measurement> measurements;
  double seconds = 0;
};

// What the search is doing, for a progress display: before a candidate is
// timed (`ratio` empty) and after (its time / the best's).
struct SearchStep {
  const OptionSet& candidate;
  std::optional<double> ratio;
  const OptionSet& best;
  double best_speedup;  // the defaults' time / the best's, so far
  int timed;            // candidates timed so far
  double elapsed_s;
};

using Compare = std::function<double(const OptionSet& a, const OptionSet& b)>;
using Clock = std::function<double()>;  // seconds, monotonic

SearchResult search(const OptionSet& defaults, const Grid& grid, const Compare& compare, double budget_s,
                    double margin = 0.005, const std::function<void(const SearchStep&)>& progress = {},
                    const Clock& clock = {});

// The sweep as a table, fastest first, and a last line naming the best.
std::string table(const SearchResult& result);

}  // namespace mok::tune
