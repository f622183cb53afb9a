#include "plan/sm_split.hpp"

#include <algorithm>
#include <cmath>

namespace mok::plan {

int default_dispatch_ctas(const LayerConfig& config, int ctas_per_rank) {
  if (ctas_per_rank < 2) return 1;  // the caller's check reports the missing GEMM CTA
  const double k = config.top_k;
  const double hidden = static_cast<double>(config.hidden);
  // Per token: k rows of 2H bytes copied; 6 H (I k + S) useful FLOP.
  const double flop_per_token =
      6.0 * hidden * (static_cast<double>(config.intermediate) * k + static_cast<double>(config.shared_width()));
  const double row_bytes = 2.0 * hidden;
  double cycles_per_row = std::max(kDispatchCyclesPerRow, row_bytes / kDispatchBytesPerCycle);
  // FP8: the dispatch also quantizes each row it pulls (three warps a row,
  // bound by their arithmetic, which grows with the row's width), while the
  // GEMMs run faster. Measured on the DeepSeek-V3 slice (one H200,
  // docs/perf-notes.md q5): 6, 7, 8 and 10 dispatch CTAs gave 5.55, 5.51,
  // 5.48 and 5.73-5.95 ms; 1.2 more of a row's byte cost gives 8 there.
  // v26 (the GEMMs and the quantizing both faster since): before the
  // dispatch's sixteen-values-a-lane quantizing, 5, 6 and 7 CTAs gave
  // 1.29x, 1.16x and 1.06x the time of 8, and 8 to 12 the same within
  // their spread; after it, 6 and 7 are within 2% of 8 alone and 8 stays
  // the fastest back to back (the power-capped case), so the rule keeps 8.
  // Provisional until x is quantized on its home rank before the pull
  // (docs/fp8-forward-design.md).
  if (config.dtype == DType::kFP8E4M3) cycles_per_row += 1.2 * row_bytes / kDispatchBytesPerCycle;
  const double dispatch_per_gemm_sm = k * cycles_per_row * kGemmFlopPerCycle / flop_per_token;
  const double share = dispatch_per_gemm_sm / (1.0 + dispatch_per_gemm_sm);
  const int ctas = static_cast<int>(std::ceil(ctas_per_rank * share));
  return std::clamp(ctas, 1, ctas_per_rank - 1);
}

}  // namespace mok::plan
