// Host side of the row scatter: checks and launch.
#include "mok/scatter_rows.hpp"

#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.hpp"
#include "device/host/gemm_host.hpp"
#include "device/kernel/scatter_rows_kernel.cuh"
#include "mok/error.hpp"

namespace mok {

void validate_scatter_rows(const ScatterRowsArgs& args) {
  require(args.num_sources >= 1 && args.num_sources <= kMaxScatterSources, "num_sources", args.num_sources,
          "must be in [1, 4]");
  require(args.width >= 8 && args.width % 8 == 0, "width", args.width, "must be a positive multiple of 8");
  require(args.tokens >= 0, "tokens", args.tokens, "must be >= 0");
  require(args.k >= 1 && args.k <= device::kScatterMaxK, "k", args.k, "must be in [1, 64]");
  require(args.num_rows >= 0, "num_rows", args.num_rows, "must be >= 0");
  // One block per token and per kScatterZeroRows rows: the grid stays below 2^31 blocks.
  require(args.tokens + args.num_rows / device::kScatterZeroRows < (int64_t{1} << 31) - 1, "tokens + num_rows / 32",
          args.tokens + args.num_rows / device::kScatterZeroRows, "must be below 2^31 - 1");
  if (args.num_rows == 0) return;
  for (int s = 0; s < args.num_sources; ++s) {
    device::require_pointer(args.outs[s], "outs[s]", 16);
    if (args.tokens > 0) device::require_pointer(args.sources[s], "sources[s]", 16);
  }
  device::require_pointer(args.entry_of_row, "entry_of_row", 8);
  if (args.tokens > 0) device::require_pointer(args.row_of_entry, "row_of_entry", 8);
}

void scatter_rows(const ScatterRowsArgs& args, CUstream_st* stream) {
  validate_scatter_rows(args);
  if (args.num_rows == 0) return;
  device::ScatterRowsParams p{};
  for (int s = 0; s < args.num_sources; ++s) {
    p.sources[s] = static_cast<const uint4*>(args.sources[s]);
    p.outs[s] = static_cast<uint4*>(args.outs[s]);
  }
  p.num_sources = args.num_sources;
  p.row_of_entry = args.row_of_entry;
  p.entry_of_row = args.entry_of_row;
  p.tokens = args.tokens;
  p.k = args.k;
  p.num_rows = args.num_rows;
  p.chunks = args.width / 8;
  const int64_t zero_blocks =
      args.zero_unclaimed_rows ? (args.num_rows + device::kScatterZeroRows - 1) / device::kScatterZeroRows : 0;
  const int64_t blocks = args.tokens + zero_blocks;
  if (blocks == 0) return;
  device::scatter_rows_kernel<<<static_cast<unsigned>(blocks), device::kScatterThreads, 0, stream>>>(p);
  MOK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mok
