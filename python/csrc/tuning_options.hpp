// The fused forward's tuning options as the torch ops take them. The ops take them as one `int[] tuning` argument in this
// order; torch.ops.mok.tuning_option_names() hands the names to python/mok,
// which builds the list from keyword arguments; the op cache keys on the whole
// list. So an option added here reaches the Python keyword, the op and the
// cache key at once, and cannot be missing from any of them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mok/fused_forward.hpp"
#include "op_checks.hpp"

namespace mok::torch_ops {

// The list is include/mok/fused_forward.hpp's MOK_FOR_EACH_TUNING_OPTION.
// Here 0 keeps the library's default (for the CTA counts, 0 already means
// "automatic"), so that no default is written twice.

#define MOK_COUNT_ONE(name) +1
inline constexpr size_t kTuningOptionCount = 0 MOK_FOR_EACH_TUNING_OPTION(MOK_COUNT_ONE);
#undef MOK_COUNT_ONE

using TuningValues = std::array<int64_t, kTuningOptionCount>;

inline std::vector<std::string> tuning_option_names() {
#define MOK_NAME(name) #name,
  return {MOK_FOR_EACH_TUNING_OPTION(MOK_NAME)};
#undef MOK_NAME
}

// The op's `int[] tuning` argument, checked for its length.
inline TuningValues tuning_values(at::IntArrayRef tuning) {
  expect(tuning.size() == kTuningOptionCount,
         "tuning must hold " + num(static_cast<int64_t>(kTuningOptionCount)) + " values (got " +
             num(static_cast<int64_t>(tuning.size())) + "); python/mok builds it from keyword arguments");
  TuningValues values{};
  for (size_t i = 0; i < kTuningOptionCount; ++i) values[i] = tuning[i];
  return values;
}

// FusedForwardOptions with the given values over the library's defaults;
// values that do not fit an int are refused, the rest validated by
// FusedForward.
inline FusedForwardOptions forward_options(const TuningValues& values) {
  FusedForwardOptions options;
  size_t i = 0;
#define MOK_SET(name)                                              \
  if (values[i] != 0) options.name = checked_int(values[i], #name); \
  ++i;
  MOK_FOR_EACH_TUNING_OPTION(MOK_SET)
#undef MOK_SET
  return options;
}

}  // namespace mok::torch_ops
