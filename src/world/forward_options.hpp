// The fused forward's options: which world they describe, the checks that
// refuse a bad value (mok::Error naming the field and what is allowed), and
// the defaults resolved against the GPUs the world runs on. Plain C++: the
// GPUs come in as GpuFacts, queried by the caller, so every rule here is
// tested on the CPU (tests/cpu/test_forward_options.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "mok/fused_forward.hpp"
#include "mok/layer_config.hpp"
#include "world/kernel_facts.hpp"

namespace mok::world {

enum class WorldKind { kVirtual, kPeer, kProcess };

WorldKind world_kind(const FusedForwardOptions& options);
const char* world_kind_name(WorldKind kind);

// Upper bounds that keep the kernel's 32-bit row arithmetic exact
// (protocol/pass_table.hpp adds a minibatch to a schedule's padded rows,
// which stay below 2^30 + 2^17, and counts the ring's rows and tiles in int32).
inline constexpr int kMaxMinibatchRows = 1 << 29;
inline constexpr long long kMaxRingRows = 1ll << 30;

// The GPUs this process sees: the current one, and each visible GPU's SMs.
struct GpuFacts {
  int current_device = 0;
  std::vector<int> sm_count;  // [visible device]
  std::vector<long long> l2_bytes;  // [visible device]; empty: not known (every n-major rule off)
};
// Asks the CUDA runtime (defined in fused_forward.cu).
GpuFacts query_gpus();

// Checks config and options and returns the options with every default
// resolved (ctas_per_rank, comm_ctas_per_rank; device_ordered forced on in a
// process world). Throws mok::Error naming the first bad field.
FusedForwardOptions resolve_options(const LayerConfig& config, const FusedForwardOptions& options,
                                    const KernelFacts& kernel, const GpuFacts& gpus);

// The forward's kinds whose pipeline blocks run n-tile major
// (protocol::PassShape::n_major_kinds). The gate/up block does when one
// expert's W13 (2 I x H) is larger than half the rank's GPU's L2 and an
// expert's m-tiles at uniform routing times the gate/up n-tiles are more
// than one and a half times the rank's GEMM CTAs. Then the tasks running at once cover only
// a fraction of one expert's m-tiles, and m-tile major order reads the
// expert's whole W13 from memory once per m-tile (few, wide experts:
// Mixtral, Llama 4 Scout); n-tile major reads each W13 panel once per
// minibatch. The presets the forward was tuned on stay m-tile major.
// `resolved`: resolve_options' result; `gate_up_n_tiles`: the gate/up kind's
// n-tiles (protocol::pass_geometry); `gate_up_kind`: its index in the table.
uint32_t forward_n_major_kinds(const LayerConfig& config, const FusedForwardOptions& resolved, const GpuFacts& gpus,
                               const KernelFacts& kernel, int32_t gate_up_kind, int32_t gate_up_n_tiles);

// The GPU of each rank's workspace: devices[r] in a peer world, the current
// GPU for every rank otherwise (a process world serves its one rank there).
std::vector<int> rank_devices(const LayerConfig& config, const FusedForwardOptions& options, const GpuFacts& gpus);

}  // namespace mok::world
