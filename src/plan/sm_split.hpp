// How the fused forward splits a rank's SMs between dispatch and GEMM CTAs
// when the caller leaves it to the library (FusedForwardOptions::
// comm_ctas_per_rank = 0).
#pragma once

#include "mok/layer_config.hpp"

namespace mok::plan {

// Measured rates the split balances, per SM and per cycle (one H200,
// docs/perf-notes.md, f7): a GEMM CTA's tensor cores retire 4096 useful bf16
// FLOP per cycle in the mainloop; a dispatch CTA moves ~22 bytes of x rows
// per cycle into the ring (31 GB/s at ~1.4 GHz, bound by L2 traffic while the
// GEMMs run), whatever the row width.
inline constexpr double kGemmFlopPerCycle = 4096.0;
inline constexpr double kDispatchBytesPerCycle = 22.0;

// The fewest dispatch CTAs that keep the GEMM CTAs fed: x rows copied per
// useful FLOP (k / (3 (I k + S)) in bf16) sets the share of the rank's SMs
// the copies need; rounded up, because a starved GEMM side costs far more
// than one CTA too many (3 instead of 4 dispatch CTAs on the DeepSeek-V3
// slice: 0.91x; 5: 0.99x). At least 1, and at least one GEMM CTA left.
int default_dispatch_ctas(const LayerConfig& config, int ctas_per_rank);

}  // namespace mok::plan
