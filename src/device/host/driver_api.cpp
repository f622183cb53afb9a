#include "device/host/driver_api.hpp"

#include <cuda_runtime.h>

#include <string>

#include "common/cuda_check.hpp"
#include "mok/error.hpp"

namespace mok::device {
namespace {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
using ErrorNameFn = CUresult (*)(CUresult, const char**);

// The driver's function for `symbol` with its CUDA 12.0 signature.
void* driver_entry_point(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  MOK_CUDA_CHECK(cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    throw Error(std::string("CUDA driver entry point not found: ") + symbol);
  }
  return fn;
}

}  // namespace

CUtensorMap encode_tensor_map_tiled(const char* what, CUtensorMapDataType type, cuuint32_t rank,
                                    const void* base, const cuuint64_t* dims,
                                    const cuuint64_t* byte_strides, const cuuint32_t* box,
                                    const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2_promotion,
                                    CUtensorMapFloatOOBfill oob_fill) {
  static const auto encode = reinterpret_cast<EncodeTiledFn>(driver_entry_point("cuTensorMapEncodeTiled"));
  CUtensorMap map;
  const CUresult status = encode(&map, type, rank, const_cast<void*>(base), dims, byte_strides, box,
                                 element_strides, interleave, swizzle, l2_promotion, oob_fill);
  if (status != CUDA_SUCCESS) {
    static const auto error_name = reinterpret_cast<ErrorNameFn>(driver_entry_point("cuGetErrorName"));
    const char* name = "unknown";
    error_name(status, &name);
    throw Error(std::string("cuTensorMapEncodeTiled failed for operand ") + what + ": " + name);
  }
  return map;
}

}  // namespace mok::device
