// A set of the fused forward's tuning options, by the names Python uses
// (mok.TUNING_OPTIONS, the fields of MOK_FOR_EACH_TUNING_OPTION): what the
// tuners search over and what the tuning cache stores under "options". An
// option the set leaves out keeps the library's default or rule.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "mok/fused_forward.hpp"  // host-only: the options and their defaults, in every build
#include "tune/json_value.hpp"

namespace mok::tune {

// Ordered by name, so that two equal sets compare equal and print alike.
using OptionSet = std::map<std::string, int>;

// The field of `options` named `name` ("ring_slots"), or null when `name` is
// not a tuning option.
int* option_field(FusedForwardOptions& options, std::string_view name);

// `base` with every option of `set` applied; throws mok::Error naming an
// unknown option.
FusedForwardOptions apply(FusedForwardOptions base, const OptionSet& set);

// {"minibatch_rows": 3072, ...}: the cache's "options" object.
json::Value to_json(const OptionSet& set);

// The same on one line, as Python's json.dumps(options, sort_keys=True).
std::string describe(const OptionSet& set);

}  // namespace mok::tune
