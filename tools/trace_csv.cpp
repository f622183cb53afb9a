#include "trace_csv.hpp"

#include <cstdio>

#include "mok/error.hpp"

namespace mok::tools {

void write_trace_csv(const std::vector<TraceEvent>& events, const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) throw Error("--trace " + path + ": cannot open for writing");
  std::fprintf(file, "rank,cta,kind,detail,begin_ns,end_ns,cycles\n");
  for (const TraceEvent& e : events) {
    std::fprintf(file, "%d,%d,%s,%d,%llu,%llu,%u\n", e.rank, e.cta, trace_kind_name(static_cast<TraceKind>(e.kind)),
                 e.detail, static_cast<unsigned long long>(e.begin_ns), static_cast<unsigned long long>(e.end_ns),
                 e.cycles);
  }
  if (std::fclose(file) != 0) throw Error("--trace " + path + ": write failed");
}

}  // namespace mok::tools
