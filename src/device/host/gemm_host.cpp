#include "device/host/gemm_host.hpp"

#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "common/cuda_check.hpp"
#include "device/host/driver_api.hpp"
#include "mok/error.hpp"

namespace mok::device {

void require_pointer(const void* p, const char* field, uintptr_t alignment) {
  if (p == nullptr) throw Error(std::string(field) + " is null");
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0) {
    // No iostreams on paths the torch extension runs (see src/world/fused_forward.cu).
    char text[32];
    std::snprintf(text, sizeof(text), "%p", p);
    throw Error(std::string(field) + " = " + text + ": must be " + std::to_string(alignment) + "-byte aligned");
  }
}

int hopper_sm_count(const char* who) {
  struct DeviceInfo {
    int device = -1;
    int sms = 0;
  };
  thread_local DeviceInfo cached;
  int device = 0;
  MOK_CUDA_CHECK(cudaGetDevice(&device));
  if (cached.device != device) {
    int major = 0;
    MOK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    if (major != 9) {
      throw Error(std::string(who) + " needs a Hopper GPU (sm_90a); device " + std::to_string(device) +
                  " has compute capability " + std::to_string(major) + ".x");
    }
    MOK_CUDA_CHECK(cudaDeviceGetAttribute(&cached.sms, cudaDevAttrMultiProcessorCount, device));
    cached.device = device;
  }
  return cached.sms;
}

CUtensorMap encode_operand_map(const char* what, CUtensorMapDataType type, const void* base, int rank,
                               const cuuint64_t* dims, const cuuint64_t* byte_strides, const cuuint32_t* box) {
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  return encode_tensor_map_tiled(what, type, static_cast<cuuint32_t>(rank), base,
                                 dims, byte_strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace mok::device
