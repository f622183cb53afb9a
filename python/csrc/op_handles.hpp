// Typed handles to mok's own torch ops, for C++ code that calls one op from
// another through the dispatcher (so every argument check stays where the op
// is defined). The Signature must be the exact C++ type the op's kernel was
// registered with: the dispatcher checks it when the handle is made. A
// handle is cheap to call but not to make; callers keep theirs in a static.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace mok::torch_ops {

template <class Signature>
c10::TypedOperatorHandle<Signature> mok_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

}  // namespace mok::torch_ops
