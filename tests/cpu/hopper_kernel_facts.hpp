// The facts of today's fused kernel, for CPU tests of the host side
// (src/world/fused_kernel.cu reads the real ones from the device constants;
// these tests only need a plausible kernel).
#pragma once

#include "world/kernel_facts.hpp"

namespace mok::test_support {

inline world::KernelFacts hopper_kernel_facts() {
  world::KernelFacts k;
  k.tile_m = 128;
  k.token_tile_m = 128;
  k.schedule_warps_per_cta = 12;
  k.max_top_k = 16;
  k.max_hidden = 8192;
  k.max_fp8_k = 32768;
  k.max_local_experts = 1024;
  k.tensor_maps = 8;
  k.tensor_map_bytes = 128;
  k.tensor_map_alignment = 64;
  return k;
}

// The FP8 forward's instantiation (fused_kernel_facts(DType::kFP8E4M3)):
// 128-row routed tiles (the wide FP8 tiles) and 128-row bf16 shared ones, the rest shared.
inline world::KernelFacts hopper_fp8_kernel_facts() {
  world::KernelFacts k = hopper_kernel_facts();
  k.tile_m = 128;  // the wide FP8 tiles: the bf16 forward's heights
  return k;
}

}  // namespace mok::test_support
