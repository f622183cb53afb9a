// Argument checks shared by every torch op, run before anything is launched.
// Each failure names the argument and says what was expected.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "op_errors.hpp"

namespace mok::torch_ops {

// TMA reads operands in 16-byte units, so a tensor it reads must start on a
// 16-byte boundary (a slice of a larger tensor may not).
inline constexpr int64_t kOperandAlignment = 16;

inline std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + num(t.size(d));
  return s + "]";
}

// "[r]": rank r's entry of a per-rank list argument, for messages.
inline std::string at_rank(int64_t r) {
  std::string at = "[";  // appended, not "[" + ... + "]": GCC 12 warns falsely (-Wrestrict) on that
  at += num(r);
  at += "]";
  return at;
}

// `value` as an int, refusing what an int cannot hold instead of wrapping
// into a valid-looking number. `name` names it in the message.
inline int checked_int(int64_t value, const std::string& name) {
  expect(value >= std::numeric_limits<int>::min() && value <= std::numeric_limits<int>::max(),
         name + " = " + num(value) + " is out of range (it must fit a 32-bit int)");
  return static_cast<int>(value);
}

// What an argument must be. `device` is the device every argument of the op
// shares (the first tensor's); `device_is` says in the message what it is.
struct TensorSpec {
  at::ScalarType dtype;
  int64_t dim;
  bool aligned = false;  // read by TMA: must start on a kOperandAlignment boundary
};

// `t` is defined, on `device`, of the spec's dtype and rank, contiguous, and
// aligned where the spec asks. Meta tensors (fake tensors under
// torch.compile) have no address, so alignment is checked on real ones only.
inline void check_tensor(const at::Tensor& t, const std::string& name, const TensorSpec& spec,
                         const at::Device& device, const std::string& device_is = "the op runs on") {
  expect(t.defined(), name + " is undefined");
  expect(t.device() == device, name + " is on " + t.device().str() + "; " + device_is + " " + device.str());
  expect(t.scalar_type() == spec.dtype, name + " must be " + c10::toString(spec.dtype) + " (got " +
                                            c10::toString(t.scalar_type()) + ")");
  expect(t.dim() == spec.dim,
         name + " must have " + num(spec.dim) + " dimensions (got shape " + shape_of(t) + ")");
  expect(t.is_contiguous(), name + " must be contiguous (call .contiguous() on it)");
  if (spec.aligned && !t.is_meta() && t.numel() > 0) {
    const auto address = reinterpret_cast<uintptr_t>(t.data_ptr());
    expect(address % kOperandAlignment == 0,
           name + " must start on a " + num(kOperandAlignment) + "-byte boundary (a slice at an offset is not; " +
               "copy it with .clone())");
  }
}

// `t` has exactly `sizes`; `what` says how they were derived, for the message.
inline void check_shape(const at::Tensor& t, const std::string& name, const std::vector<int64_t>& sizes,
                        const std::string& what = "") {
  bool same = t.dim() == static_cast<int64_t>(sizes.size());
  std::string want = "[";
  for (size_t d = 0; d < sizes.size(); ++d) {
    same = same && t.size(static_cast<int64_t>(d)) == sizes[d];
    want += (d ? ", " : "") + num(sizes[d]);
  }
  expect(same, name + " must be " + (what.empty() ? "" : what + " = ") + want + "] (got " + shape_of(t) + ")");
}

// A grouped op's row tables for G groups: group_offset int32 [G + 1] and
// group_rows int32 [G] on `device` (their values stay on the device: no op
// reads them on the host).
inline void check_group_tables(const at::Tensor& group_offset, const at::Tensor& group_rows, int64_t groups,
                               const at::Device& device, const std::string& device_is) {
  const TensorSpec table{at::kInt, 1};
  check_tensor(group_offset, "group_offset", table, device, device_is);
  check_tensor(group_rows, "group_rows", table, device, device_is);
  expect(group_rows.size(0) == groups,
         "group_rows must have G = " + num(groups) + " entries (got " + num(group_rows.size(0)) + ")");
  expect(group_offset.size(0) == groups + 1,
         "group_offset must have G + 1 = " + num(groups + 1) + " entries (got " + num(group_offset.size(0)) + ")");
}

// The ops run on CUDA tensors; a CPU kernel is registered only to say so.
inline void expect_cuda(const at::Device& device, const std::string& name) {
  expect(device.is_cuda() || device.is_meta(), name + " is on " + device.str() + "; mok runs on CUDA tensors");
}

}  // namespace mok::torch_ops
