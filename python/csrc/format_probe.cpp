// torch.ops.mok.format_probe(value): formats `value` through a std::ostream
// inside this library and returns the text. It is the one operation that
// once crashed torch 2.11's process on the device machine (an ostream
// inserting an integer, in code of this library: docs/perf-notes.md, "Torch
// extension"). The ops themselves never use an ostream (op_errors.hpp); this
// probe lets any machine be checked for that fault without a GPU, and
// python/tests/test_errors.py runs it.
#include <torch/library.h>

#include <sstream>
#include <string>

namespace {

std::string format_probe(int64_t value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) { m.def("format_probe(int value) -> str", &format_probe); }
