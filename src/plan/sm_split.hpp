// How the fused forward splits a rank's SMs between dispatch and GEMM CTAs
// when the caller leaves it to the library (FusedForwardOptions::
// comm_ctas_per_rank = 0).
#pragma once

#include "mok/layer_config.hpp"

namespace mok::plan {

// Measured rates the split balances, per SM and per cycle (one H200): a
// GEMM CTA's tensor cores retire 4096 useful bf16 FLOP per cycle in the
// mainloop (docs/perf-notes.md, f7); a dispatch CTA copies one x row into the
// ring every ~650 cycles while the GEMMs run, whatever its width up to the
// widest preset's 14 KB (H 7168) -- 22 bytes per cycle there, ~6 at H 2048
// (v6: Qwen1.5-MoE and Qwen3-30B, H 2048, wanted 3x and 2x the CTAs a
// per-byte rate gives). Past that width the bytes set the rate.
//
// v7: with a tile's schedule entries staged in shared memory a dispatch CTA
// copies about twice the rows at H 2048 (Qwen1.5-MoE: 5 CTAs as fast as 10),
// yet fewer CTAs than this rule's gave at most 2% (GLM-4.5-Air, 7 of 9)
// and mostly lost (the dispatch CTAs also build the schedule and take a share
// of the combine), so the rule keeps the rates measured before; the tuners'
// grid brackets it.
inline constexpr double kGemmFlopPerCycle = 4096.0;
inline constexpr double kDispatchCyclesPerRow = 652.0;
inline constexpr double kDispatchBytesPerCycle = 22.0;

// The fewest dispatch CTAs that keep the GEMM CTAs fed: x rows copied per
// useful FLOP (k rows per token against 6 H (I k + S) FLOP), at the larger of
// the per-row and per-byte costs, sets the share of the rank's SMs the
// copies need; rounded up, because a starved GEMM side costs far more than
// one CTA too many (3 instead of 4 dispatch CTAs on the DeepSeek-V3 slice:
// 0.91x; 5: 0.99x). At least 1, and at least one GEMM CTA left.
int default_dispatch_ctas(const LayerConfig& config, int ctas_per_rank);

}  // namespace mok::plan
