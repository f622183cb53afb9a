// mok_wgmma_bench's operand fill: resident stages of finite values, the
// same for every launch of a CTA.
#pragma once

#include <cstdint>

namespace mok::tools {

// Every thread of the CTA: n_words hashed words, each ANDed with `mask`
// (which clears the bits that could make a NaN or an infinity of the type
// the stages are read as).
__device__ __forceinline__ void fill_finite_words(uint32_t* words, int n_words, uint32_t mask) {
  for (int i = threadIdx.x; i < n_words; i += blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ (blockIdx.x * 40503u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    words[i] = h & mask;
  }
}

}  // namespace mok::tools
