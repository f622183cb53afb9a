// The values the tuners try per option. The one list is
// python/mok/tuning_grid.txt: python/mok/tune.py reads it at import, and the
// build embeds it in mok_cli (tools/CMakeLists.txt), so that mok_cli tune and
// python -m mok.tune search the same space in the same order.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mok::tune {

// Options in walk order, each with its values in walk order.
using Grid = std::vector<std::pair<std::string, std::vector<int>>>;

// Parses the grid's text: one option a line, its name then its values;
// '#' starts a comment. Throws mok::Error naming the line for a value that is
// not an integer or a name that is not a tuning option.
Grid parse_grid(std::string_view text);

// python/mok/tuning_grid.txt as this build embedded it.
const Grid& default_grid();

}  // namespace mok::tune
