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
  const double dispatch_per_gemm_sm = bytes_per_flop * kGemmFlopPerCycle / kDispatchBytesPerCycle;
  const double share = dispatch_per_gemm_sm / (1.0 + dispatch_per_gemm_sm);
  const int ctas = static_cast<int>(std::ceil(ctas_per_rank * share));
  return std::clamp(ctas, 1, ctas_per_rank - 1);
}

}  // namespace mok::plan
