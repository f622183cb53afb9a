// The tuners' value grid (tuning_grid.hpp), parsed from the text the build
// embedded from python/mok/tuning_grid.txt.
#include "tune/tuning_grid.hpp"

#include <charconv>
#include <sstream>

#include "mok/error.hpp"
#include "tune/option_set.hpp"
#include "tuning_grid_text.hpp"  // generated: kTuningGridText

namespace mok::tune {

Grid parse_grid(std::string_view text) {
  Grid grid;
  std::istringstream lines{std::string(text)};
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    std::istringstream words(line.substr(0, line.find('#')));
    std::string name, word;
    if (!(words >> name)) continue;
    FusedForwardOptions probe;
    if (option_field(probe, name) == nullptr) {
      throw Error("tuning grid line " + std::to_string(number) + ": '" + name + "' is not a tuning option");
    }
    std::vector<int> values;
    while (words >> word) {
      int value = 0;
      const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
      if (ec != std::errc() || end != word.data() + word.size()) {
        throw Error("tuning grid line " + std::to_string(number) + ": '" + word + "' is not an integer");
      }
      values.push_back(value);
    }
    grid.emplace_back(name, std::move(values));
  }
  return grid;
}

const Grid& default_grid() {
  static const Grid grid = parse_grid(kTuningGridText);
  return grid;
}

}  // namespace mok::tune
