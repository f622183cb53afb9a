// mok::Error: the one exception type the host API throws.
//
// Every rejection names what was wrong (a field, a rank/token/slot, a CUDA
// call) so that a user can fix the input without reading our source.
#pragma once

#include <stdexcept>
#include <string>

namespace mok {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error("mok: " + what) {}
};

// Throws mok::Error("<field> = <value>: <allowed>") when `ok` is false.
// Kept as a function (not a macro) so call sites read like sentences.
template <typename Value>
inline void require(bool ok, const char* field, const Value& value, const char* allowed) {
  if (!ok) {
    throw Error(std::string(field) + " = " + std::to_string(value) + ": " + allowed);
  }
}

}  // namespace mok
