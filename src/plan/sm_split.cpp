#include "plan/sm_split.hpp"

#include <algorithm>
#include <cmath>

namespace mok::plan {

int default_dispatch_ctas(const LayerConfig& config, int ctas_per_rank) {
  if (ctas_per_rank < 2) return 1;  // the caller's check reports the missing GEMM CTA
  const double k = config.top_k;
  // Per token: k rows of 2H bytes copied; 6 H (I k + S) useful FLOP.
  const double bytes_per_flop = 2.0 * k / (6.0 * (static_cast<double>(config.intermediate) * k +
                                                  static_cast<double>(config.shared_width())));
  double dispatch_per_gemm_sm = bytes_per_flop * kGemmFlopPerCycle / kDispatchBytesPerCycle;
  // FP8: the dispatch also quantizes each row it pulls (three warps a row,
  // bound by their arithmetic more than by the bytes), while the GEMMs run
  // faster. Measured on the DeepSeek-V3 slice (one H200, docs/perf-notes.md
  // q5): 6, 7, 8 and 10 dispatch CTAs gave 5.55, 5.51, 5.48 and 5.73-5.95
  // ms; this factor gives 8 there. Provisional until x is quantized on its
  // home rank before the pull (docs/fp8-forward-design.md).
  if (config.dtype == DType::kFP8E4M3) dispatch_per_gemm_sm *= 2.2;
  const double share = dispatch_per_gemm_sm / (1.0 + dispatch_per_gemm_sm);
  const int ctas = static_cast<int>(std::ceil(ctas_per_rank * share));
  return std::clamp(ctas, 1, ctas_per_rank - 1);
}

}  // namespace mok::plan
