// Makes a GPU current for a scope, then restores the one that was current.
#pragma once

#include <cuda_runtime.h>

#include "common/cuda_check.hpp"

namespace mok::world {

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    MOK_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) MOK_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace mok::world
