// The tuners' value grid (tuning_grid.hpp), parsed from the text the build
// embedded from python/mok/tuning_grid.txt.
#include "tune/tuning_grid.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include "mok/error.hpp"
#include "tune/option_set.hpp"
#include "tuning_grid_text.hpp"  // generated: kTuningGridText

namespace mok::tune {

namespace {

// A whole word of the text as T, or false.
template <class T>
bool parse_number(std::string_view word, T& value) {
  const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
  return ec == std::errc() && end == word.data() + word.size();
}

}  // namespace

GridText parse_grid(std::string_view text) {
  GridText grid;
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
    std::vector<GridValue> values;
    while (words >> word) {
      GridValue v;
      const bool ok = word.size() > 1 && word[0] == 'x'
                          ? parse_number(std::string_view(word).substr(1), v.factor) && v.factor > 0 &&
                                std::isfinite(v.factor)
                          : parse_number(std::string_view(word), v.value);
      if (!ok) {
        throw Error("tuning grid line " + std::to_string(number) + ": '" + word +
                    "' is neither an integer nor 'x' and a positive factor");
      }
      values.push_back(v);
    }
    grid.emplace_back(name, std::move(values));
  }
  return grid;
}

const GridText& default_grid() {
  static const GridText grid = parse_grid(kTuningGridText);
  return grid;
}

Grid resolve_grid(const GridText& grid, const std::map<std::string, int>& library) {
  Grid out;
  for (const auto& [name, values] : grid) {
    std::vector<int> numbers;
    for (const GridValue& v : values) {
      if (v.factor == 0) {
        numbers.push_back(v.value);
        continue;
      }
      const auto it = library.find(name);
      if (it == library.end()) throw Error("tuning grid: '" + name + "' has factors but no library value to scale");
      const int n = std::max(1, static_cast<int>(std::floor(v.factor * it->second + 0.5)));
      if (n != it->second && std::find(numbers.begin(), numbers.end(), n) == numbers.end()) numbers.push_back(n);
    }
    out.emplace_back(name, std::move(numbers));
  }
  return out;
}

}  // namespace mok::tune
