// Host side of the padding clear: checks and launch.
#include "mok/zero_padding.hpp"

#include <cuda_runtime.h>

#include "common/cuda_check.hpp"
#include "device/host/gemm_host.hpp"
#include "device/kernel/zero_padding_kernel.cuh"
#include "mok/error.hpp"

namespace mok {

void validate_zero_padding(const ZeroPaddingArgs& args) {
  require(args.row_bytes > 0 && args.row_bytes % 16 == 0, "row_bytes", args.row_bytes,
          "must be a positive multiple of 16");
  require(args.m_total >= 0 && args.m_total <= (int64_t{1} << 36), "m_total", args.m_total,
          "must be in [0, 2^36] (one block per 64 rows)");
  require(args.num_groups >= 1 && args.num_groups < (1 << 30), "num_groups", args.num_groups, "must be >= 1");
  if (args.m_total == 0) return;
  device::require_pointer(args.data, "data", 16);
  device::require_pointer(args.group_offset, "group_offset", 4);
  device::require_pointer(args.group_rows, "group_rows", 4);
}

void zero_padding_rows(const ZeroPaddingArgs& args, CUstream_st* stream) {
  validate_zero_padding(args);
  if (args.m_total == 0) return;
  const int64_t blocks = (args.m_total + device::kZeroPaddingRows - 1) / device::kZeroPaddingRows;
  device::zero_padding_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      static_cast<uint8_t*>(args.data), args.row_bytes, args.m_total, args.group_offset, args.group_rows,
      args.num_groups);
  MOK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mok
