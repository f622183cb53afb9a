// Host side of the grouped weight-gradient GEMM: argument checks, tensor
// maps, launch. Its tile configuration is chosen here, and only here.
#include "mok/weight_grad.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/cuda_check.hpp"
#include "device/gemm/tile_config.cuh"
#include "device/host/gemm_host.hpp"
#include "device/kernel/weight_grad_kernel.cuh"
#include "mok/error.hpp"

namespace mok {
namespace {

using device::kInt32Max;

// 128 output rows (64 per consumer warpgroup) x 256 output columns, K = 64
// rows per stage, both operands MN-major: the forward's tile shape, so the
// stage ring and register split are the ones measured there.
using WeightGradConfig = device::GemmTileConfig<128, 256, 4, EpilogueKind::kWeightGrad, ElementType::kBF16,
                                                OperandMajor::kMN, OperandMajor::kMN>;

}  // namespace

void validate_weight_grad(const WeightGradArgs& args) {
  require(args.num_groups > 0, "num_groups", args.num_groups, "must be >= 1");
  require(args.m >= 64 && args.m % 64 == 0 && args.m <= kInt32Max, "m", args.m,
          "must be a positive multiple of 64 (below 2^31)");
  require(args.n >= 64 && args.n % 64 == 0 && args.n <= kInt32Max, "n", args.n,
          "must be a positive multiple of 64 (below 2^31)");
  require(args.m_total >= 0 && args.m_total <= kInt32Max, "m_total", args.m_total, "must be in [0, 2^31)");
  require(args.max_ctas >= 0, "max_ctas", args.max_ctas, "must be >= 0 (0 = one per SM)");
  const int64_t out_elems = static_cast<int64_t>(args.num_groups) * args.m * args.n;
  require(out_elems <= kInt32Max * int64_t{2}, "num_groups * m * n", out_elems, "must be below 2^32");
  const int64_t tasks = static_cast<int64_t>(args.num_groups) * ((args.m + 127) / 128) * ((args.n + 255) / 256);
  require(tasks <= kInt32Max, "tile count", tasks, "must be below 2^31; split the call");
  if (args.m_total > 0) {
    device::require_pointer(args.a, "a", 16);
    device::require_pointer(args.b, "b", 16);
  }
  if ((args.out == nullptr) == (args.out_bf16 == nullptr)) {
    throw Error("exactly one of out (fp32) and out_bf16 must be given");
  }
  if (args.out != nullptr) device::require_pointer(args.out, "out", 16);
  if (args.out_bf16 != nullptr) {
    device::require_pointer(args.out_bf16, "out_bf16", 16);
  }
  device::require_pointer(args.group_offset, "group_offset", 4);
  device::require_pointer(args.group_rows, "group_rows", 4);
}

void grouped_weight_grad(const WeightGradArgs& args, CUstream_st* stream) {
  using Cfg = WeightGradConfig;
  validate_weight_grad(args);
  const cuuint64_t rows = static_cast<cuuint64_t>(args.m_total > 0 ? args.m_total : 1);
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(Cfg::kMNBlock), static_cast<cuuint32_t>(Cfg::kBlockK)};
  const cuuint64_t a_dims[2] = {static_cast<cuuint64_t>(args.m), rows};
  const cuuint64_t a_strides[1] = {static_cast<cuuint64_t>(args.m) * 2};
  const cuuint64_t b_dims[2] = {static_cast<cuuint64_t>(args.n), rows};
  const cuuint64_t b_strides[1] = {static_cast<cuuint64_t>(args.n) * 2};
  // With no rows every group is empty and nothing is read: the maps only
  // need a valid address, so they borrow out's.
  const void* some_out = args.out != nullptr ? static_cast<const void*>(args.out) : args.out_bf16;
  const void* a = args.m_total > 0 ? args.a : some_out;
  const void* b = args.m_total > 0 ? args.b : some_out;
  const CUtensorMap a_map = device::encode_bf16_map("a (rows x m)", a, 2, a_dims, a_strides, box);
  const CUtensorMap b_map = device::encode_bf16_map("b (rows x n)", b, 2, b_dims, b_strides, box);
  // bf16 output: the tiles are stored by TMA, [64 rows][64 columns] per box
  // (weight_grad_tile.cuh); fp32 output does not use a map (it gets a copy).
  CUtensorMap out_map = a_map;
  if (args.out_bf16 != nullptr) {
    const cuuint64_t out_dims[2] = {static_cast<cuuint64_t>(args.n),
                                    static_cast<cuuint64_t>(args.num_groups) * static_cast<cuuint64_t>(args.m)};
    const cuuint64_t out_strides[1] = {static_cast<cuuint64_t>(args.n) * 2};
    const cuuint32_t out_box[2] = {64, 64};
    out_map = device::encode_bf16_map("out_bf16 (groups x m, n)", args.out_bf16, 2, out_dims, out_strides, out_box);
  }

  device::WeightGradParams params;
  params.out = args.out;
  params.out_bf16 = static_cast<uint16_t*>(args.out_bf16);
  params.group_offset = args.group_offset;
  params.group_rows = args.group_rows;
  params.num_groups = args.num_groups;
  params.m = static_cast<int>(args.m);
  params.n = static_cast<int>(args.n);
  params.accumulate = args.accumulate ? 1 : 0;

  const int64_t tasks = static_cast<int64_t>(args.num_groups) * ((args.m + Cfg::kBlockM - 1) / Cfg::kBlockM) *
                        ((args.n + Cfg::kBlockN - 1) / Cfg::kBlockN);
  int ctas = device::hopper_sm_count("grouped_weight_grad");
  if (args.max_ctas > 0 && args.max_ctas < ctas) ctas = args.max_ctas;
  if (tasks < ctas) ctas = static_cast<int>(tasks);

  const int smem = device::weight_grad_smem_bytes<Cfg>();
  auto* kernel = args.out_bf16 == nullptr ? device::weight_grad_kernel<Cfg, false>
                 : args.accumulate        ? device::weight_grad_kernel<Cfg, true, true>
                                          : device::weight_grad_kernel<Cfg, true>;
  MOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<ctas, Cfg::kThreads, smem, stream>>>(a_map, b_map, out_map, params);
  MOK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mok
