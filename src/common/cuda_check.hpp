// Checking every CUDA runtime and driver call: a failure becomes a mok::Error
// that names the call, its error string, and where it was made.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

namespace mok::detail {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_driver_error(CUresult status, const char* call, const char* file, int line);

// Number of usable Hopper (compute capability 9.x) devices; 0 when there is no
// driver or no such device, without throwing.
int hopper_device_count();

}  // namespace mok::detail

#define MOK_CUDA_CHECK(call)                                                             \
  do {                                                                                   \
    const cudaError_t mok_status_ = (call);                                              \
    if (mok_status_ != cudaSuccess) ::mok::detail::throw_cuda_error(mok_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define MOK_CU_CHECK(call)                                                               \
  do {                                                                                   \
    const CUresult mok_status_ = (call);                                                 \
    if (mok_status_ != CUDA_SUCCESS) ::mok::detail::throw_driver_error(mok_status_, #call, __FILE__, __LINE__); \
  } while (0)
