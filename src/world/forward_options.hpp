// The fused forward's options: which world they describe, the checks that
// refuse a bad value (mok::Error naming the field and what is allowed), and
// the defaults resolved against the GPUs the world runs on. Plain C++: the
// GPUs come in as GpuFacts, queried by the caller, so every rule here is
// tested on the CPU (tests/cpu/test_forward_options.cpp).
#pragma once

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
};
// Asks the CUDA runtime (defined in fused_forward.cu).
GpuFacts query_gpus();

// Checks config and options and returns the options with every default
// resolved (ctas_per_rank, comm_ctas_per_rank; device_ordered forced on in a
// process world). Throws mok::Error naming the first bad field.
FusedForwardOptions resolve_options(const LayerConfig& config, const FusedForwardOptions& options,
                                    const KernelFacts& kernel, const GpuFacts& gpus);

// The GPU of each rank's workspace: devices[r] in a peer world, the current
// GPU for every rank otherwise (a process world serves its one rank there).
std::vector<int> rank_devices(const LayerConfig& config, const FusedForwardOptions& options, const GpuFacts& gpus);

}  // namespace mok::world
