#include <algorithm>
#include <cmath>
#include <string>

#include "mok/bf16.hpp"
#include "mok/error.hpp"
#include "mok/reference.hpp"

namespace mok {

double relative_l2_error(std::span<const uint16_t> out_bf16, const std::vector<std::vector<double>>& reference) {
  size_t expected = 0;
  for (const auto& rank : reference) expected += rank.size();
  if (expected != out_bf16.size()) {
    throw Error("relative_l2_error: " + std::to_string(out_bf16.size()) + " outputs against " +
                std::to_string(expected) + " reference values");
  }
  double err2 = 0, ref2 = 0;
  size_t at = 0;
  for (const auto& rank : reference) {
    for (double v : rank) {
      const double d = bf16_bits_to_float(out_bf16[at++]) - v;
      err2 += std::isnan(d) ? 1e30 : d * d;
      ref2 += v * v;
    }
  }
  return std::sqrt(err2 / std::max(ref2, 1e-30));
}

}  // namespace mok
