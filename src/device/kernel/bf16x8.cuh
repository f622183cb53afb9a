// Eight bf16 values in one 16-byte word: what the combines load and store per
// lane. Unpacking is exact; packing rounds to nearest even.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace mok::device {

__device__ __forceinline__ void unpack_bf16x8(const uint4& packed, float (&v)[8]) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ uint4 pack_bf16x8(const float (&v)[8]) {
  uint4 packed;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int i = 0; i < 4; ++i) pairs[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  return packed;
}

// acc[i] = acc[i] + v[i], one rounding each (no contraction).
__device__ __forceinline__ void add_bf16x8(float (&acc)[8], const uint4& v) {
  float f[8];
  unpack_bf16x8(v, f);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], f[i]);
}

}  // namespace mok::device
