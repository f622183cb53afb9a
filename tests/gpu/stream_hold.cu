#include "stream_hold.hpp"

#include <cstdint>

#include "common/cuda_check.hpp"

namespace mok::test_support {
namespace {

__global__ void spin_for(uint64_t nanoseconds) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(10000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

}  // namespace

void hold_stream(cudaStream_t stream, int milliseconds) {
  spin_for<<<1, 1, 0, stream>>>(static_cast<uint64_t>(milliseconds) * 1000000u);
  MOK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mok::test_support
