// mok_cli tune's command line (tune_args.hpp).
#include "tune/tune_args.hpp"

#include <charconv>
#include <string>
#include <system_error>

#include "mok/error.hpp"

namespace mok::tune {
namespace {

// Whole-string numbers: std::stoi would take "12abc" as 12.
template <typename T>
T integer(const std::string& option, const std::string& text) {
  T v{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw Error("tune " + option + " " + text + ": expected an integer");
  }
  return v;
}

double seconds(const std::string& option, const std::string& text) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !(v >= 0)) {
    throw Error("tune " + option + " " + text + ": expected a number of seconds >= 0");
  }
  return v;
}

}  // namespace

TuneArgs parse_tune_args(int argc, const char* const* argv) {
  TuneArgs a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Error("tune: option " + arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") a.help = true;
    else if (arg == "--preset") a.preset = value();
    else if (tools::is_layer_dim_flag(arg)) tools::parse_layer_dim(a.dims, "tune", arg, value());
    else if (arg == "--world") a.world = integer<int>(arg, value());
    else if (arg == "--tokens") a.tokens = integer<int>(arg, value());
    else if (arg == "--routing") a.routing = value();
    else if (arg == "--fp8") a.fp8 = true;
    else if (arg == "--seed") a.seed = integer<uint64_t>(arg, value());
    else if (arg == "--budget") a.budget_s = seconds(arg, value());
    else if (arg == "--cache") a.cache = value();
    else if (arg == "--rounds") a.rounds = integer<int>(arg, value());
    else if (arg == "--iterations") a.iterations = integer<int>(arg, value());
    else throw Error("tune: unknown option '" + arg + "' (see mok_cli tune --help)");
  }
  if (a.rounds < 1 || a.iterations < 1) throw Error("tune: --rounds and --iterations must be at least 1");
  return a;
}

std::string tune_usage() {
  return "usage: mok_cli tune [options]\n"
         "  The C++ twin of python -m mok.tune: on a Hopper GPU, walks the tuning options one at a\n"
         "  time over the grid of python/mok/tuning_grid.txt, times each candidate against the best\n"
         "  so far in paired rounds (a b b a) on the same data, keeps it when faster by more than\n"
         "  0.5%, and stores the winner in the tuning cache that mok.fused_forward, mok.nn.MoE and\n"
         "  mok.hf read (the same file and key as python -m mok.tune).\n"
         "  --preset NAME          layer dims (default deepseek-v3-ep8-slice: python -m mok.tune's)\n" +
         tools::layer_dims_usage() +
         "  --world R              ranks of the virtual world on one GPU (default 1)\n"
         "  --tokens T             tokens per rank (default 4096; the cache keys on its power-of-two bucket)\n"
         "  --routing MODE         uniform | skewed | same (default uniform)\n"
         "  --fp8                  tune the fused FP8 forward (routed weights quantized as\n"
         "                         mok.quantize_weights does; an entry of its own, precision fp8, which\n"
         "                         mok.fused_forward_fp8 reads)\n"
         "  --seed S               synthetic data seed (default 1)\n"
         "  --budget SECONDS       time for the search (default 120); a candidate started runs to its end\n"
         "  --cache PATH           cache file (default $XDG_CACHE_HOME/mok/tuning.json, else\n"
         "                         ~/.cache/mok/tuning.json)\n"
         "  --rounds N             paired rounds per comparison (default 5; the median ratio counts)\n"
         "  --iterations N         passes per timing, enqueued back to back (default 10)\n";
}

LayerConfig tune_config(const TuneArgs& args) {
  return tools::config_with_dims("tune", args.preset, args.dims, args.world, args.tokens, {},
                                 args.fp8 ? DType::kFP8E4M3 : DType::kBF16);
}

}  // namespace mok::tune
