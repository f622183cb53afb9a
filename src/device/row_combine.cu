// Host side of the row combine: checks and launch.
#include "mok/row_combine.hpp"

#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.hpp"
#include "device/host/gemm_host.hpp"
#include "device/kernel/row_combine_kernel.cuh"
#include "mok/error.hpp"

namespace mok {

void validate_row_combine(const RowCombineArgs& args) {
  require(args.width >= 8 && args.width % 8 == 0, "width", args.width, "must be a positive multiple of 8");
  require(args.tokens >= 0, "tokens", args.tokens, "must be >= 0");
  require(args.k >= 0, "k", args.k, "must be >= 0");
  require(args.num_rows >= 0, "num_rows", args.num_rows, "must be >= 0");
  // One thread per 8 columns, 256 per block: the grid must stay below 2^31 blocks.
  require(args.tokens * (args.width / 8) < int64_t{1} << 38, "tokens * width / 8", args.tokens * (args.width / 8),
          "must be below 2^38");
  if (args.tokens == 0) return;
  device::require_pointer(args.out, "out", 16);
  if (args.base != nullptr) device::require_pointer(args.base, "base", 16);
  if (args.k > 0) {
    device::require_pointer(args.row_index, "row_index", 4);
    if (args.num_rows > 0) device::require_pointer(args.rows, "rows", 16);
  }
}

void row_combine(const RowCombineArgs& args, CUstream_st* stream) {
  validate_row_combine(args);
  if (args.tokens == 0) return;
  // With no rows every index must be negative (nothing to read); a null
  // rows pointer is then never dereferenced.
  const int64_t items = args.tokens * (args.width / 8);
  constexpr int kThreads = 256;
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  device::row_combine_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const uint16_t*>(args.rows), args.row_index, static_cast<const uint16_t*>(args.base),
      static_cast<uint16_t*>(args.out), args.tokens, args.k, args.width);
  MOK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mok
