// Host side of the grouped GEMM: argument checks, tensor maps, launch. The
// tile configurations instantiated in this build are listed here, and only
// here.
#include "mok/grouped_gemm.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "common/cuda_check.hpp"
#include "device/gemm/tile_config.cuh"
#include "device/host/gemm_host.hpp"
#include "device/kernel/grouped_gemm_kernel.cuh"
#include "device/kernel/row_parts_kernel.cuh"
#include "mok/error.hpp"

namespace mok {
namespace {

using mok::EpilogueKind;
using device::GemmTileConfig;

// --- The instantiations (tile BM x BN x 64, stages, epilogue) ---------------
// BN is the wgmma N: SwiGLU tiles hold 128 gate + 128 up weight rows and emit
// 128 output columns. docs/perf-notes.md records why these shapes (128x128 with
// 6 stages was measured and lost: -6% down, -10% SwiGLU).
using PlainConfig = GemmTileConfig<128, 256, 4, EpilogueKind::kPlain>;
using SwigluConfig = GemmTileConfig<128, 256, 4, EpilogueKind::kSwiGLU>;
using PlainKNConfig = GemmTileConfig<128, 256, 4, EpilogueKind::kPlain, mok::ElementType::kBF16, mok::OperandMajor::kMN>;
// The SwiGLU backward reads W2 k-by-n ([H, I] as nn.Linear stores it) and
// emits 256 columns of acc per tile (the parts of d w are per 256 columns).
// Block-scaled FP8: 128 x 128 tiles (one B scale block per tile and stage),
// 128 of K per stage, 6 stages (32 KB each); the promotion keeps a second set
// of 64 accumulators, hence BN 128.
using Fp8Config = GemmTileConfig<128, 128, 6, EpilogueKind::kPlain, mok::ElementType::kE4M3>;
// Its 2-CTA twin (GroupedGemmArgs::fp8_multicast): the two CTAs of a cluster
// take neighbouring n-tiles of the same rows and each loads half of their A
// box for both: a quarter fewer L2 bytes per FMA (docs/fp8-forward-design.md,
// section 1).
using Fp8MulticastConfig = GemmTileConfig<128, 128, 6, EpilogueKind::kPlain, mok::ElementType::kE4M3,
                                          mok::OperandMajor::kK, mok::OperandMajor::kK, 2>;
// Its SwiGLU twin: 64 gate + 64 up weight rows per tile (each half inside one
// 128-row scale block), 64 output columns.
using Fp8SwigluConfig = GemmTileConfig<128, 128, 6, EpilogueKind::kSwiGLU, mok::ElementType::kE4M3>;
// The FP8 forward's gate/up with h quantized in the epilogue: split N (64
// rows; warpgroup 0 the 128 gate rows, 1 the 128 up rows, so a tile emits
// one whole 128-column scale block per row), 4 stages of 40 KB and the
// 32 KB exchange between the warpgroups.
using Fp8SwigluQuantizeConfig = GemmTileConfig<64, 256, 4, EpilogueKind::kSwiGLUQuantize, mok::ElementType::kE4M3>;
// The plain FP8 tile split the same way (GroupedGemmArgs::fp8_split_n): 64
// rows, warpgroup c the weight rows n0 + 128 c .. (one 256-row B box), so
// that every routed kind of the fused FP8 forward runs 64-row tiles. 4
// stages of 40 KB as the fused kernel has (kFusedStages) and its gate/up
// twin; without the exchange a fifth would fit (223 KB of the 227).
using Fp8SplitNConfig = GemmTileConfig<64, 256, 4, EpilogueKind::kPlain, mok::ElementType::kE4M3>;
static_assert(Fp8SplitNConfig::kSplitN && Fp8SplitNConfig::kOutCols == 256 && Fp8SwigluQuantizeConfig::kSplitN &&
                  !Fp8Config::kSplitN && !Fp8SwigluConfig::kSplitN && !Fp8MulticastConfig::kSplitN,
              "split N: the FP8 64 x 256 tiles only");
using SwigluBackwardConfig =
    GemmTileConfig<128, 256, 4, EpilogueKind::kSwiGLUBackward, mok::ElementType::kBF16, mok::OperandMajor::kMN>;

template <class Cfg>
GroupedGemmConfig describe_config() {
  GroupedGemmConfig c;
  c.block_m = Cfg::kBlockM;
  c.block_n = Cfg::kBlockN;
  c.block_k = Cfg::kBlockK;
  c.out_cols = Cfg::kOutCols;
  c.stages = Cfg::kStages;
  c.consumer_warpgroups = Cfg::kConsumerWarpgroups;
  c.threads = Cfg::kThreads;
  c.smem_bytes = device::grouped_gemm_smem_bytes<Cfg>();
  return c;
}

using device::encode_bf16_map;
using device::kInt32Max;
using device::require_pointer;

int sm_count() { return device::hopper_sm_count("grouped_gemm"); }

// Row tiles per raster band (sched/grouped_tiles.cuh). MOK_GEMM_BAND
// overrides it for tuning runs; results never depend on it.
int env_int(const char* name, int fallback) {
  const char* env = std::getenv(name);
  const int value = env != nullptr ? std::atoi(env) : 0;
  return value > 0 ? value : fallback;
}
int default_raster_band() {
  static const int band = env_int("MOK_GEMM_BAND", 8);
  return band;
}

template <class Cfg>
void launch(const GroupedGemmArgs& args, cudaStream_t stream) {
  const cuuint64_t k = static_cast<cuuint64_t>(args.k);
  const cuuint64_t n = static_cast<cuuint64_t>(args.n);
  const cuuint64_t g = static_cast<cuuint64_t>(args.num_groups);
  const cuuint64_t row_bytes = k * mok::element_bytes(Cfg::kElement);
  constexpr CUtensorMapDataType kType = Cfg::kElement == mok::ElementType::kE4M3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                                                                : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;

  const cuuint64_t a_dims[2] = {k, static_cast<cuuint64_t>(args.m_total)};
  const cuuint64_t a_strides[1] = {row_bytes};
  const cuuint32_t a_box[2] = {Cfg::kBlockK, Cfg::kBlockM / Cfg::kClusterN};  // multicast: each CTA loads half
  const CUtensorMap a_map = device::encode_operand_map("a", kType, args.a, 2, a_dims, a_strides, a_box);

  CUtensorMap b_map;
  if constexpr (Cfg::kBMajor == mok::OperandMajor::kMN) {
    const cuuint64_t b_dims[3] = {n, k, g};
    const cuuint64_t b_strides[2] = {n * 2, k * n * 2};
    const cuuint32_t b_box[3] = {static_cast<cuuint32_t>(Cfg::kMNBlock), Cfg::kBlockK, 1};
    b_map = encode_bf16_map("b (k-by-n)", args.b, 3, b_dims, b_strides, b_box);
  } else if constexpr (Cfg::kGateUp) {
    const cuuint64_t b_dims[4] = {k, n, 2, g};
    const cuuint64_t b_strides[3] = {row_bytes, n * row_bytes, 2 * n * row_bytes};
    const cuuint32_t b_box[4] = {Cfg::kBlockK, Cfg::kBlockN / 2, 1, 1};
    b_map = device::encode_operand_map("b (w13)", kType, args.b, 4, b_dims, b_strides, b_box);
  } else {
    // One box of the tile's BN weight rows (the split-N FP8 tile: 256, TMA's
    // largest box side; its warpgroups read rows 0..127 and 128..255).
    const cuuint64_t b_dims[3] = {k, n, g};
    const cuuint64_t b_strides[2] = {row_bytes, n * row_bytes};
    const cuuint32_t b_box[3] = {Cfg::kBlockK, Cfg::kBlockN, 1};
    b_map = device::encode_operand_map("b", kType, args.b, 3, b_dims, b_strides, b_box);
  }

  device::GroupedGemmParams params;
  params.out = static_cast<uint16_t*>(args.out);
  params.group_offset = args.group_offset;
  params.group_rows = args.group_rows;
  params.num_groups = args.num_groups;
  params.m_total = static_cast<int>(args.m_total);
  params.n_cols = static_cast<int>(args.n);
  params.k = static_cast<int>(args.k);
  params.band = args.raster_band > 0 ? args.raster_band : default_raster_band();
  params.swiglu_backward = {};
  params.out_scales = args.out_scales;
  params.fp8 = {};
  if constexpr (Cfg::kElement == mok::ElementType::kE4M3) {
    constexpr bool kSwiGLU = Cfg::kGateUp;
    const int64_t b_rows = kSwiGLU ? 2 * args.n : args.n;
    params.fp8 = {args.a_scales, args.b_scales, static_cast<int32_t>(args.k / 128), static_cast<int32_t>(b_rows / 128),
                  static_cast<int32_t>(args.m_total), kSwiGLU ? static_cast<int32_t>(args.n) : 0};
  }
  if constexpr (Cfg::kEpilogue == EpilogueKind::kSwiGLUBackward) {
    params.swiglu_backward.preact = static_cast<const uint16_t*>(args.preact);
    params.swiglu_backward.row_scale = args.row_scale;
    params.swiglu_backward.d13 = static_cast<uint16_t*>(args.out);
    params.swiglu_backward.scaled_act = static_cast<uint16_t*>(args.scaled_act);
    params.swiglu_backward.parts = args.row_scale_grad != nullptr ? args.scratch : nullptr;
    params.swiglu_backward.n = static_cast<int>(args.n);
    params.swiglu_backward.parts_cols = static_cast<int>(swiglu_backward_parts(args.n));
  }

  // Upper bound on tasks without reading the device-resident counts: each
  // group has at most ceil(rows / BM) row tiles, and sum(rows) <= m_total.
  // With A multicast a task is a cluster's pair of n-tiles.
  constexpr int kTaskCols = Cfg::kOutCols * Cfg::kClusterN;
  const int64_t n_tiles = (args.n + kTaskCols - 1) / kTaskCols;
  const int64_t max_tasks = ((args.m_total + Cfg::kBlockM - 1) / Cfg::kBlockM + args.num_groups) * n_tiles;
  if (max_tasks > kInt32Max) throw Error("grouped_gemm: task count exceeds 2^31; split the call");

  const int smem = device::grouped_gemm_smem_bytes<Cfg>();
  auto* kernel = device::grouped_gemm_kernel<Cfg>;
  MOK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  if constexpr (Cfg::kClusterN == 1) {
    int ctas = sm_count();
    if (args.max_ctas > 0 && args.max_ctas < ctas) ctas = args.max_ctas;
    if (max_tasks < ctas) ctas = static_cast<int>(max_tasks);
    kernel<<<ctas, Cfg::kThreads, smem, stream>>>(a_map, b_map, params);
  } else {
    // Clusters of kClusterN CTAs: as many as can be resident at once (an
    // SM's partner must sit in its GPC, so this can be below SMs / 2), each
    // a persistent walker of task pairs.
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute cluster = {};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = Cfg::kClusterN;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    config.blockDim = dim3(Cfg::kThreads);
    config.dynamicSmemBytes = static_cast<size_t>(smem);
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    config.gridDim = dim3(static_cast<unsigned>(sm_count() / Cfg::kClusterN * Cfg::kClusterN));
    int clusters = 0;
    MOK_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    if (clusters < 1) throw Error("grouped_gemm: no 2-CTA cluster of the FP8 multicast tile fits on this GPU");
    if (args.max_ctas > 0) clusters = std::min(clusters, std::max(1, args.max_ctas / Cfg::kClusterN));
    if (max_tasks < clusters) clusters = static_cast<int>(max_tasks);
    config.gridDim = dim3(static_cast<unsigned>(clusters * Cfg::kClusterN));
    MOK_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, a_map, b_map, params));
  }
  MOK_CUDA_CHECK(cudaGetLastError());
  if constexpr (Cfg::kEpilogue == EpilogueKind::kSwiGLUBackward) {
    if (args.row_scale_grad != nullptr) {
      device::sum_row_parts_kernel<<<args.num_groups, 256, 0, stream>>>(
          args.scratch, params.swiglu_backward.parts_cols, args.group_offset, args.group_rows, args.row_scale_grad);
      MOK_CUDA_CHECK(cudaGetLastError());
    }
  }
}

}  // namespace

int64_t swiglu_backward_parts(int64_t n) {
  constexpr int64_t kCols = SwigluBackwardConfig::kOutCols;
  return (n + kCols - 1) / kCols;
}

std::string GroupedGemmConfig::describe() const {
  std::ostringstream s;
  s << "tile " << block_m << "x" << block_n << "x" << block_k << " (out cols " << out_cols << "), "
    << stages << " stages, " << consumer_warpgroups << " consumer warpgroups + 1 producer, "
    << threads << " threads, " << smem_bytes << " B smem";
  return s.str();
}

GroupedGemmConfig grouped_gemm_config(GemmEpilogue epilogue) {
  if (epilogue == GemmEpilogue::kSwiGLUBackward) return describe_config<SwigluBackwardConfig>();
  if (epilogue == GemmEpilogue::kSwiGLUQuantize) return describe_config<Fp8SwigluQuantizeConfig>();
  return epilogue == GemmEpilogue::kSwiGLU ? describe_config<SwigluConfig>()
                                           : describe_config<PlainConfig>();
}

void validate_grouped_gemm(const GroupedGemmArgs& args) {
  if (args.epilogue != GemmEpilogue::kPlain && args.epilogue != GemmEpilogue::kSwiGLU &&
      args.epilogue != GemmEpilogue::kSwiGLUBackward && args.epilogue != GemmEpilogue::kSwiGLUQuantize) {
    throw Error("epilogue = " + std::to_string(static_cast<int>(args.epilogue)) + ": not a GemmEpilogue");
  }
  if (args.b_layout != WeightLayout::kNK && args.b_layout != WeightLayout::kKN) {
    throw Error("b_layout = " + std::to_string(static_cast<int>(args.b_layout)) + ": not a WeightLayout");
  }
  const bool gate_up = args.epilogue == GemmEpilogue::kSwiGLU || args.epilogue == GemmEpilogue::kSwiGLUQuantize;
  if (args.b_layout == WeightLayout::kKN && gate_up) {
    throw Error("b_layout = kKN: not with the SwiGLU epilogue (a SwiGLU b holds gate and up rows)");
  }
  if (args.epilogue == GemmEpilogue::kSwiGLUBackward) {
    if (args.b_layout != WeightLayout::kKN) {
      throw Error("epilogue kSwiGLUBackward reads W2 as stored ([G, k = H, n = I]): b_layout must be kKN");
    }
    require_pointer(args.preact, "preact", 16);
    if (args.row_scale != nullptr) require_pointer(args.row_scale, "row_scale", 4);
    if (args.scaled_act != nullptr) require_pointer(args.scaled_act, "scaled_act", 16);
    if (args.row_scale_grad != nullptr) {
      require_pointer(args.row_scale_grad, "row_scale_grad", 4);
      require_pointer(args.scratch, "scratch (needed with row_scale_grad)", 16);
    }
  }
  require(args.num_groups > 0, "num_groups", args.num_groups, "must be >= 1");
  require(args.k >= 64 && args.k % 64 == 0 && args.k <= kInt32Max, "k", args.k,
          "must be a positive multiple of 64 (below 2^31)");
  require(args.n >= 64 && args.n % 64 == 0 && args.n <= kInt32Max, "n", args.n,
          "must be a positive multiple of 64 (below 2^31)");
  require(args.m_total >= 0 && args.m_total <= kInt32Max, "m_total", args.m_total,
          "must be in [0, 2^31)");
  require(args.max_ctas >= 0, "max_ctas", args.max_ctas, "must be >= 0 (0 = one per SM)");
  require(args.raster_band >= 0, "raster_band", args.raster_band, "must be >= 0 (0 = default)");
  const int64_t weight_rows = gate_up ? 2 * args.n : args.n;
  require(static_cast<int64_t>(args.num_groups) * weight_rows <= kInt32Max, "num_groups * weight rows",
          static_cast<int64_t>(args.num_groups) * weight_rows, "must be below 2^31");
  if (args.element != GemmElement::kBF16 && args.element != GemmElement::kE4M3) {
    throw Error("element = " + std::to_string(static_cast<int>(args.element)) + ": not a GemmElement");
  }
  if (args.element == GemmElement::kE4M3) {
    if (args.epilogue == GemmEpilogue::kSwiGLUBackward || args.b_layout != WeightLayout::kNK) {
      throw Error("element kE4M3: the plain, SwiGLU or SwiGLU-quantize epilogue with b as [G, n, k] ([G, 2n, k]) "
                  "only");
    }
    require(args.k % 128 == 0, "k", args.k, "must be a multiple of 128 with kE4M3 (one scale per 128 of K)");
    const bool swiglu = args.epilogue == GemmEpilogue::kSwiGLU;
    require(swiglu ? args.n % 64 == 0 : args.n % 128 == 0, "n", args.n,
            swiglu ? "must be a multiple of 64 with kE4M3 SwiGLU (2n weight rows in 128-row blocks)"
                   : "must be a multiple of 128 with kE4M3 (128 x 128 weight blocks; SwiGLU-quantize: one "
                     "scale per 128 output columns)");
    require(args.m_total * (args.k / 128) <= kInt32Max, "m_total * k / 128", args.m_total * (args.k / 128),
            "must fit in 32 bits with kE4M3 (the kernel indexes a_scales with 32-bit offsets)");
    require_pointer(args.a_scales, "a_scales", 1);
    require_pointer(args.b_scales, "b_scales", 1);
  }
  if (args.fp8_split_n) {
    if (args.element != GemmElement::kE4M3 || args.epilogue != GemmEpilogue::kPlain) {
      throw Error("fp8_split_n: the FP8 plain tile's option (element kE4M3, epilogue kPlain) only");
    }
    if (args.fp8_multicast) {
      throw Error("fp8_split_n and fp8_multicast: one FP8 tile at a time (the multicast pair shares 128-row tiles)");
    }
    require(args.n % Fp8SplitNConfig::kOutCols == 0, "n", args.n,
            "must be a multiple of 256 with fp8_split_n (each tile's warpgroups take two whole 128-row B "
            "scale blocks)");
  }
  if (args.epilogue == GemmEpilogue::kSwiGLUQuantize) {
    if (args.element != GemmElement::kE4M3) {
      throw Error("epilogue kSwiGLUQuantize: element must be kE4M3 (it is the FP8 forward's gate/up)");
    }
    require_pointer(args.out_scales, "out_scales", 1);
  }
  require_pointer(args.a, "a", 16);
  require_pointer(args.b, "b", 16);
  require_pointer(args.out, "out", 16);
  require_pointer(args.group_offset, "group_offset", 4);
  require_pointer(args.group_rows, "group_rows", 4);
}

void grouped_gemm(const GroupedGemmArgs& args, CUstream_st* stream) {
  validate_grouped_gemm(args);
  if (args.m_total == 0) return;  // no rows: nothing to write
  if (args.element == GemmElement::kE4M3) {
    if (args.epilogue == GemmEpilogue::kSwiGLU) {
      launch<Fp8SwigluConfig>(args, stream);
    } else if (args.epilogue == GemmEpilogue::kSwiGLUQuantize) {
      launch<Fp8SwigluQuantizeConfig>(args, stream);
    } else if (args.fp8_split_n) {
      launch<Fp8SplitNConfig>(args, stream);
    } else if (args.fp8_multicast && args.n % (2 * Fp8MulticastConfig::kOutCols) == 0) {
      launch<Fp8MulticastConfig>(args, stream);
    } else {
      launch<Fp8Config>(args, stream);
    }
  } else if (args.epilogue == GemmEpilogue::kSwiGLUBackward) {
    launch<SwigluBackwardConfig>(args, stream);
  } else if (args.epilogue == GemmEpilogue::kSwiGLU) {
    launch<SwigluConfig>(args, stream);
  } else if (args.b_layout == WeightLayout::kKN) {
    launch<PlainKNConfig>(args, stream);
  } else {
    launch<PlainConfig>(args, stream);
  }
}

}  // namespace mok
