// The synthetic routing a mok_cli command runs (--routing), by name: shared
// by mok_cli's run and its tune command.
#pragma once

#include <string>

#include "mok/error.hpp"
#include "mok/synthetic.hpp"

namespace mok::tools {

inline synthetic::RoutingMode routing_mode(const std::string& name) {
  if (name == "uniform") return synthetic::RoutingMode::kUniform;
  if (name == "skewed") return synthetic::RoutingMode::kSkewed;
  if (name == "same") return synthetic::RoutingMode::kSameExperts;
  throw Error("--routing " + name + ": expected uniform, skewed or same");
}

}  // namespace mok::tools
