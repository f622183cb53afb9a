// A traced pass's events as CSV (one row per event: rank, cta, kind, detail,
// begin_ns, end_ns, cycles), for a timeline plot or an analysis script;
// mok_cli --trace FILE writes the forward's, --backward --trace FILE the
// backward's.
#pragma once

#include <string>
#include <vector>

#include "mok/pass_trace.hpp"

namespace mok::tools {

// Throws mok::Error when `path` cannot be written.
void write_trace_csv(const std::vector<TraceEvent>& events, const std::string& path);

}  // namespace mok::tools
