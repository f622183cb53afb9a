// What the fused-forward ops share at their boundary: argument checks whose
// messages name the argument, and the rule that no C++ exception crosses the
// dispatcher (a c10::Error, or an integer formatted through an ostream,
// crashed the process under torch 2.11 on the device machine). An op runs its
// body under `guarded`: on failure it returns a sentinel and leaves the
// message where python/mok reads it and raises RuntimeError.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mok/fused_forward.hpp"

namespace mok::torch_ops {

// A rejected argument; caught by `guarded`.
struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void expect(bool ok, const std::string& message) {
  if (!ok) throw BadInput("mok: " + message);
}

inline std::string num(int64_t v) { return std::to_string(v); }

// `t` is a defined, contiguous `dim`-D tensor of `dtype` on `device`;
// `device_is` says what `device` is in the message ("expected", "this
// rank's world is on").
inline void check_tensor(const at::Tensor& t, const std::string& name, at::ScalarType dtype, int64_t dim,
                         const at::Device& device, const std::string& device_is = "expected") {
  expect(t.defined(), name + " is undefined");
  expect(t.device() == device, name + " is on " + t.device().str() + "; " + device_is + " " + device.str());
  expect(t.scalar_type() == dtype,
         name + " must be " + c10::toString(dtype) + " (got " + c10::toString(t.scalar_type()) + ")");
  expect(t.dim() == dim, name + " must have " + num(dim) + " dimensions (got " + num(t.dim()) + ")");
  expect(t.is_contiguous(), name + " must be contiguous");
}

// `t` has exactly `sizes`.
inline void check_shape(const at::Tensor& t, const std::string& name, const std::vector<int64_t>& sizes) {
  bool same = t.dim() == static_cast<int64_t>(sizes.size());
  std::string want = "[";
  for (size_t d = 0; d < sizes.size(); ++d) {
    same = same && t.size(static_cast<int64_t>(d)) == sizes[d];
    want += (d ? ", " : "") + num(sizes[d]);
  }
  expect(same, name + " must be " + want + "]");
}

// The fused forward's tuning options as the ops take them. 0 keeps the
// library's default (FusedForwardOptions), so that the Python signatures do
// not repeat the defaults; for the CTA counts 0 already means "automatic".
// Other values go through as given and FusedForward validates them.
inline FusedForwardOptions tuning_options(int64_t minibatch_rows, int64_t ring_slots, int64_t ctas_per_rank,
                                          int64_t comm_ctas_per_rank, int64_t lookahead) {
  // Python ints are 64-bit; one that does not fit an int must not wrap into
  // a valid-looking value.
  auto to_int = [](int64_t value, const char* name) {
    expect(value >= std::numeric_limits<int>::min() && value <= std::numeric_limits<int>::max(),
           std::string(name) + " = " + num(value) + " is out of range");
    return static_cast<int>(value);
  };
  FusedForwardOptions o;
  if (minibatch_rows != 0) o.minibatch_rows = to_int(minibatch_rows, "minibatch_rows");
  if (ring_slots != 0) o.ring_slots = to_int(ring_slots, "ring_slots");
  if (lookahead != 0) o.lookahead = to_int(lookahead, "lookahead");
  o.ctas_per_rank = to_int(ctas_per_rank, "ctas_per_rank");
  o.comm_ctas_per_rank = to_int(comm_ctas_per_rank, "comm_ctas_per_rank");
  return o;
}

// Runs `body`; any exception (BadInput, mok::Error) becomes `failed` with
// its message in `error`, which is cleared first.
template <class Result, class Body>
Result guarded(std::string& error, Result failed, Body&& body) {
  error.clear();
  try {
    return body();
  } catch (const std::exception& e) {
    error = e.what();
    return failed;
  }
}

}  // namespace mok::torch_ops
