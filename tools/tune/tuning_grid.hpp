// The values the tuners try per option. The one list is
// python/mok/tuning_grid.txt: python/mok/tune.py reads it at import, and the
// build embeds it in mok_cli (tools/CMakeLists.txt), so that mok_cli tune and
// python -m mok.tune search the same space in the same order.
//
// A value is a number ("3072") or a factor of the value the library picks
// for the layer being tuned ("x1.5"): the dispatch CTAs' rule gives 4 on the
// DeepSeek-V3 slice and 30 on Qwen3-30B-A3B (plan/sm_split.cpp), so one
// fixed list cannot bracket both.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mok::tune {

// One value of the grid's text: `value` itself, or (factor > 0) the
// library's value times `factor`.
struct GridValue {
  int value = 0;
  double factor = 0;
  bool operator==(const GridValue&) const = default;
};

// The grid as written: options in walk order, each with its values in walk order.
using GridText = std::vector<std::pair<std::string, std::vector<GridValue>>>;

// The grid for one layer: every value a number.
using Grid = std::vector<std::pair<std::string, std::vector<int>>>;

// Parses the grid's text: one option a line, its name then its values;
// '#' starts a comment. Throws mok::Error naming the line for a value that is
// neither an integer nor 'x' and a positive factor, or a name that is not a
// tuning option.
GridText parse_grid(std::string_view text);

// python/mok/tuning_grid.txt as this build embedded it.
const GridText& default_grid();

// The grid for a layer whose library-chosen values are `library` (by
// option name): a factor becomes floor(factor * value + 0.5), at least 1,
// and is dropped where it lands on the library's value (the walk's start) or
// on a value the option already lists; numbers are kept as written. Throws
// mok::Error for a factor of an option `library` does not give.
Grid resolve_grid(const GridText& grid, const std::map<std::string, int>& library);

}  // namespace mok::tune
