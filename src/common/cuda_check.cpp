#include "common/cuda_check.hpp"

#include <string>

#include "mok/error.hpp"

namespace mok::detail {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  throw Error(std::string("CUDA call failed: ") + call + " -> " + cudaGetErrorName(status) + " (" +
              cudaGetErrorString(status) + ") at " + file + ":" + std::to_string(line));
}

void throw_driver_error(CUresult status, const char* call, const char* file, int line) {
  const char* name = "unknown";
  const char* text = "unknown";
  // Through the runtime's entry-point lookup, not a libcuda symbol: binaries
  // must load where no driver is installed (CI), to report GPU tests skipped.
  using ErrorTextFn = CUresult (*)(CUresult, const char**);
  void* fn = nullptr;
  if (cudaGetDriverEntryPointByVersion("cuGetErrorName", &fn, 12000, cudaEnableDefault, nullptr) ==
          cudaSuccess && fn != nullptr) {
    reinterpret_cast<ErrorTextFn>(fn)(status, &name);
  }
  if (cudaGetDriverEntryPointByVersion("cuGetErrorString", &fn, 12000, cudaEnableDefault, nullptr) ==
          cudaSuccess && fn != nullptr) {
    reinterpret_cast<ErrorTextFn>(fn)(status, &text);
  }
  throw Error(std::string("CUDA driver call failed: ") + call + " -> " + name + " (" + text +
              ") at " + file + ":" + std::to_string(line));
}

int hopper_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" status
    return 0;
  }
  int hopper = 0;
  for (int device = 0; device < count; ++device) {
    cudaDeviceProp props{};
    if (cudaGetDeviceProperties(&props, device) == cudaSuccess && props.major == 9) ++hopper;
  }
  return hopper;
}

}  // namespace mok::detail
