// The few CUDA driver API entry points mok's host code needs, resolved at run
// time through the runtime (cudaGetDriverEntryPointByVersion) rather than by
// linking libcuda: binaries then load on machines without a driver (CI), where
// the GPU tests report "skipped".
#pragma once

#include <cuda.h>

namespace mok::device {

// cuTensorMapEncodeTiled; throws mok::Error naming `what` on failure.
CUtensorMap encode_tensor_map_tiled(const char* what, CUtensorMapDataType type, cuuint32_t rank,
                                    const void* base, const cuuint64_t* dims,
                                    const cuuint64_t* byte_strides, const cuuint32_t* box,
                                    const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2_promotion,
                                    CUtensorMapFloatOOBfill oob_fill);

}  // namespace mok::device
