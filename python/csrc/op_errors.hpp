// The torch ops' one error convention: every failure raises a c10::Error
// (TORCH_CHECK), which PyTorch turns into a Python RuntimeError carrying our
// message. No op returns a sentinel or an empty list on failure, so every
// output shape depends on the input shapes only (torch.compile needs that).
//
// Messages are formatted here, with std::string and std::to_string, and
// handed to TORCH_CHECK as one C string: then no std::ostream runs in this
// library. An ostream inserting an integer inside code of this library once
// crashed torch 2.11's process on the device machine (docs/perf-notes.md,
// "Torch extension"); python/csrc/format_probe.cpp reproduces that one
// operation on its own, so that the machine can be checked without a GPU.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>
#include <exception>
#include <string>

namespace mok::torch_ops {

// Raises "mok: <message>" as a c10::Error (Python: RuntimeError).
[[noreturn]] inline void fail(const std::string& message) {
  const std::string text = "mok: " + message;
  TORCH_CHECK(false, text.c_str());
  std::terminate();  // not reached: TORCH_CHECK(false, ...) always throws
}

inline void expect(bool ok, const std::string& message) {
  if (!ok) fail(message);
}

inline std::string num(int64_t v) { return std::to_string(v); }

// Runs `body`, re-raising what the C++ library throws (mok::Error, whose
// message already starts with "mok: ", or another std::exception) as a
// c10::Error; a c10::Error passes through unchanged.
template <class Body>
decltype(auto) raising_torch_errors(Body&& body) {
  try {
    return body();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());
    std::terminate();  // not reached
  }
}

}  // namespace mok::torch_ops
