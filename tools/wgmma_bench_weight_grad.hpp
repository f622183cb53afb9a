// mok_wgmma_bench's weight-gradient table (wgmma_bench_weight_grad.cu): the
// grouped weight gradient's tiles -- short K loops, each ended by a drain and
// an epilogue -- timed in SM cycles per tile on resident stages.
#pragma once

namespace mok::tools {

// Runs the weight-gradient patterns on `ctas` CTAs, `tiles` tiles each of
// `k_blocks` 64-row k-blocks, and prints one line per pattern and repetition.
void run_weight_grad_patterns(int ctas, int tiles, int k_blocks, int reps);

}  // namespace mok::tools
