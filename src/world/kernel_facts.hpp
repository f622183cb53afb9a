// What the host side of the fused forward must know about the kernel it
// launches: its limits and the sizes of the things a workspace holds for it.
// Plain data, so that validation and the workspace layout compile without
// CUDA (and are tested on the CPU); the CUDA side fills it from the device
// constants themselves (fused_kernel.cu), never from copies of them.
#pragma once

#include <cstddef>

namespace mok::world {

struct KernelFacts {
  int tile_m = 0;                  // rows of one routed GEMM m-tile (the schedule pads experts to it)
  int token_tile_m = 0;            // rows of one token tile, the m-tile of the rank's own tokens (the shared
                                   // expert's tiles; tile_m in both kernels today, the pass table's
                                   // token_tile_m where it sets one): their buffers are padded to it
  int schedule_warps_per_cta = 0;  // warps of a dispatch CTA that build the schedule
  int max_top_k = 0;               // the combine holds a token's top_k weights in registers
  int max_hidden = 0;              // widest x row a dispatch copy slot holds (bf16 elements)
  int max_fp8_k = 0;               // deepest K of an FP8 tile: its B scales are staged in shared memory
  int max_local_experts = 0;       // local experts the in-kernel schedule counts in shared memory
  int tensor_maps = 0;             // TMA tensor maps per rank
  size_t tensor_map_bytes = 0;     // sizeof(CUtensorMap)
  size_t tensor_map_alignment = 0; // alignof(CUtensorMap)
};

}  // namespace mok::world
