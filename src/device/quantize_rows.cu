// Host side of the row quantizer: checks and launch.
#include "mok/quantize_rows.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "common/cuda_check.hpp"
#include "device/host/gemm_host.hpp"
#include "device/kernel/quantize_rows_kernel.cuh"
#include "mok/error.hpp"

namespace mok {

void validate_quantize_rows(const QuantizeRowsArgs& args) {
  require(args.rows >= 0, "rows", args.rows, "must be >= 0");
  require(args.cols >= 128 && args.cols % 128 == 0, "cols", args.cols, "must be a positive multiple of 128");
  require(args.rows * (args.cols / 128) < (int64_t{1} << 33), "rows * cols", args.rows * args.cols,
          "must be below 2^40");
  if (args.rows == 0) return;
  device::require_pointer(args.x, "x", 16);
  device::require_pointer(args.values, "values", 16);
  device::require_pointer(args.scales, "scales", 1);
}

void quantize_rows_e4m3(const QuantizeRowsArgs& args, CUstream_st* stream) {
  validate_quantize_rows(args);
  if (args.rows == 0) return;
  const int64_t blocks = args.rows * (args.cols / 128);
  constexpr int kWarps = 8;
  // Enough warps to cover the GPU several times over; each strides on.
  const int64_t ctas = std::min<int64_t>((blocks + kWarps - 1) / kWarps, 132 * 16);
  device::quantize_rows_kernel<<<static_cast<unsigned>(ctas), kWarps * 32, 0, stream>>>(
      static_cast<const uint16_t*>(args.x), args.values, args.scales, blocks);
  MOK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mok
