// mok_cli --backward: the fused backward on the layer mok_cli runs (CUDA
// builds only). One training forward keeps what the backward reads; then the
// backward is timed like the forward (passes alone, and back to back), its
// gradients checked against the CPU reference where the layer is small
// enough, and their bits hashed (two builds or option sets that print the
// same hash computed the same gradients). Recompute mode (BackwardMode) is
// timed on the same forward pass against save mode, with the bytes each mode
// keeps per layer, and its gradients' hash compared with save mode's.
#pragma once

#include <cstdint>
#include <string>

#include "mok/device_layer.hpp"
#include "mok/fused_forward.hpp"
#include "mok/layer_config.hpp"
#include "mok/synthetic.hpp"

namespace mok::tools {

// Returns false when the reference check ran and failed. trace_file, when
// not empty: the traced pass's events go there as CSV (trace_csv.hpp).
bool run_backward(const LayerConfig& config, const FusedForwardOptions& options, const synthetic::Layer& layer,
                  const DeviceLayer& device, int iterations, uint64_t seed, int threads,
                  const std::string& trace_file = {});

}  // namespace mok::tools
