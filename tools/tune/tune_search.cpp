// The coordinate search (tune_search.hpp), line for line python/mok/tune.py's search().
#include "tune/tune_search.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>

namespace mok::tune {

SearchResult search(const OptionSet& defaults, const Grid& grid, const Compare& compare, double budget_s,
                    double margin, const std::function<void(const SearchStep&)>& progress, const Clock& clock) {
  const Clock now = clock ? clock : [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  const double start = now();
  SearchResult result;
  result.best = defaults;
  double best_ratio = 1.0;  // the best's time / the defaults' time
  std::set<OptionSet> tried{result.best};
  int timed = 0;
  bool improved = true;
  while (improved && now() - start < budget_s) {
    improved = false;
    for (const auto& [name, values] : grid) {
      for (const int value : values) {
        if (now() - start >= budget_s) break;
        OptionSet candidate = result.best;
        candidate[name] = value;
        if (!tried.insert(candidate).second) continue;
        if (progress) progress({candidate, std::nullopt, result.best, 1.0 / best_ratio, timed, now() - start});
        const double ratio = compare(candidate, result.best);
        ++timed;
        result.measurements.push_back({candidate, ratio * best_ratio});
        if (ratio < 1.0 - margin) {
          result.best = candidate;
          best_ratio *= ratio;
          improved = true;
        }
        if (progress) progress({candidate, ratio, result.best, 1.0 / best_ratio, timed, now() - start});
      }
    }
  }
  result.speedup = 1.0 / best_ratio;
  result.seconds = now() - start;
  return result;
}

std::string table(const SearchResult& result) {
  std::vector<Measurement> rows = result.measurements;
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Measurement& a, const Measurement& b) { return a.ratio_to_default < b.ratio_to_default; });
  char line[256];
  std::snprintf(line, sizeof line, "%-60s %16s\n", "options", "time vs defaults");
  std::string out = line;
  for (const Measurement& m : rows) {
    std::snprintf(line, sizeof line, "%-60s %16.4f\n", describe(m.options).c_str(), m.ratio_to_default);
    out += line;
  }
  std::snprintf(line, sizeof line, "best: %s (%.3fx the defaults, %.0f s of tuning)", describe(result.best).c_str(),
                result.speedup, result.seconds);
  return out + line;
}

}  // namespace mok::tune
