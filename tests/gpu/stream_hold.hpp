// Holds a stream for a while with a one-thread spinning kernel, so that work
// enqueued behind it is certainly not done when the host moves on: a test
// can then show what runs too early when passes are not ordered.
#pragma once

#include <cuda_runtime.h>

namespace mok::test_support {

void hold_stream(cudaStream_t stream, int milliseconds);

}  // namespace mok::test_support
