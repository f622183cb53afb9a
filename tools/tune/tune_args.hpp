// mok_cli tune's command line: what python -m mok.tune takes (layer dims,
// tokens, budget, cache), plus a preset, a world size, the routing and the
// rounds of the paired timing. Host-only, so that the CPU tests parse it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "layer_dims.hpp"
#include "mok/layer_config.hpp"

namespace mok::tune {

struct TuneArgs {
  // The layer: a preset's dims (the default is the dims python -m mok.tune
  // defaults to), each overridable.
  std::string preset = "deepseek-v3-ep8-slice";
  tools::LayerDims dims;
  int world = 1;              // ranks of the virtual world on one GPU
  int tokens = 4096;          // per rank
  std::string routing = "uniform";
  bool fp8 = false;           // the fused FP8 forward (its own cache entries: precision "fp8")
  uint64_t seed = 1;
  double budget_s = 120;      // as python -m mok.tune
  std::string cache;          // empty: default_cache_path()
  int rounds = 5;             // paired rounds per comparison (python's paired_compare)
  int iterations = 10;        // passes per timing (python's `passes`)
  bool help = false;
};

// argv[0] is "tune". Throws mok::Error naming a bad or unknown option.
TuneArgs parse_tune_args(int argc, const char* const* argv);

std::string tune_usage();

// The layer tune measures: the preset with the given dims, `world` ranks of
// `tokens` tokens each. Throws mok::Error for dims the library refuses.
LayerConfig tune_config(const TuneArgs& args);

}  // namespace mok::tune
