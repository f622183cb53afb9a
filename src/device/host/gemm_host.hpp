// Host helpers every standalone GEMM launcher shares (grouped_gemm.cu,
// weight_grad.cu): pointer checks, the Hopper SM count, and the bf16 operand
// tensor map with the 128-byte swizzle the tile loaders expect.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace mok::device {

inline constexpr int64_t kInt32Max = 2147483647;

// Throws mok::Error when p is null or not `alignment`-byte aligned.
void require_pointer(const void* p, const char* field, uintptr_t alignment);

// SMs of the current device; throws mok::Error unless it is a Hopper GPU
// (`who` names the caller in the message).
int hopper_sm_count(const char* who);

// An operand as a TMA tensor map: 128-byte swizzle, zero fill out of bounds
// (the box's inner dimension is one swizzle row: 64 bf16 or 128 e4m3).
CUtensorMap encode_operand_map(const char* what, CUtensorMapDataType type, const void* base, int rank,
                               const cuuint64_t* dims, const cuuint64_t* byte_strides, const cuuint32_t* box);
inline CUtensorMap encode_bf16_map(const char* what, const void* base, int rank, const cuuint64_t* dims,
                                   const cuuint64_t* byte_strides, const cuuint32_t* box) {
  return encode_operand_map(what, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, rank, dims, byte_strides, box);
}

}  // namespace mok::device
