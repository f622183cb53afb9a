// mok_cli tune on the GPU (tune_gpu.hpp): python -m mok.tune's main(), with
// mok_cli's timing machinery.
#include "tune/tune_gpu.hpp"

#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "forward_timing.hpp"
#include "mok/device_layer.hpp"
#include "mok/error.hpp"
#include "mok/fused_forward.hpp"
#include "mok/synthetic.hpp"
#include "routing_mode.hpp"
#include "tune/tune_progress.hpp"
#include "tune/tune_search.hpp"
#include "tune/tuning_cache.hpp"
#include "tune/tuning_grid.hpp"
#include "world/fp8_weights.hpp"

namespace mok::tune {
namespace {

// The fused forwards of the two option sets being compared, by set. At most
// two live at once: each holds a workspace per rank, and the walk compares
// every candidate with the one best, whose object (and its warm workspace) it
// keeps from one comparison to the next.
class ForwardPair {
 public:
  explicit ForwardPair(const LayerConfig& config) : config_(config) {}

  // Throws mok::Error when the library refuses `set` for this layer.
  FusedForward& get(const OptionSet& set, const OptionSet& other) {
    std::erase_if(alive_, [&](const auto& kv) { return kv.first != set && kv.first != other; });
    std::unique_ptr<FusedForward>& forward = alive_[set];
    if (!forward) {
      try {
        forward = std::make_unique<FusedForward>(config_, apply(FusedForwardOptions{}, set));
      } catch (...) {
        alive_.erase(set);
        throw;
      }
    }
    return *forward;
  }

 private:
  LayerConfig config_;
  std::map<OptionSet, std::unique_ptr<FusedForward>> alive_;
};

}  // namespace

GpuFacts current_gpu_facts() {
  int device = 0;
  MOK_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp props{};
  MOK_CUDA_CHECK(cudaGetDeviceProperties(&props, device));
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;  // Python says "0" without a driver too
  return {props.name, props.multiProcessorCount, cuda_version_text(CUDART_VERSION), std::to_string(driver)};
}

int run_tune_on_gpu(const TuneArgs& args) {
  const LayerConfig config = tune_config(args);
  const TuneKey key = forward_key(current_gpu_facts(), config);
  const TuningCache cache(args.cache.empty() ? default_cache_path() : args.cache);
  std::printf("mok_cli tune: %s\n  key %s\n  cache %s\n", describe(config).c_str(), key.id().c_str(),
              cache.path().c_str());
  if (const std::optional<CacheEntry> previous = cache.lookup(key)) {
    const json::Value* speedup = previous->entry.find("speedup");
    const json::Value* when = previous->entry.find("when");
    std::printf("  replaces the entry %s (%sx, %s)\n", describe(previous->options).c_str(),
                speedup != nullptr ? json::write_line(*speedup).c_str() : "?",
                when != nullptr ? json::write_line(*when).c_str() : "undated");
  }

  const synthetic::Layer layer = synthetic::make_layer(config, args.seed, tools::routing_mode(args.routing));
  const DeviceLayer device(layer);
  // FP8: the routed weights quantized on the host (mok::fp8::quantize_weight),
  // x stays bf16 (the kernel quantizes it).
  std::unique_ptr<world::Fp8RoutedWeights> fp8_weights;
  if (config.dtype == DType::kFP8E4M3) fp8_weights = std::make_unique<world::Fp8RoutedWeights>(layer);
  const std::vector<RankTensors> tensors = fp8_weights ? fp8_weights->apply(device.tensors()) : device.tensors();
  ForwardPair forwards(config);
  ProgressLine progress(stderr, args.budget_s);
  std::map<OptionSet, std::string> refused;

  // compare(a, b) = time(a) / time(b): a b b a rounds of back-to-back
  // passes, the median of the rounds' ratios (python's paired_compare).
  // A set the library refuses for this layer (an mok::Error from its
  // FusedForward) is never faster; the defaults' refusal ends the run.
  const Compare compare = [&](const OptionSet& a, const OptionSet& b) {
    FusedForward& fb = forwards.get(b, a);
    FusedForward* fa = nullptr;
    try {
      fa = &forwards.get(a, b);
    } catch (const Error& e) {
      refused[a] = e.what();
      progress.note("mok_cli tune: " + describe(a) + " refused: " + e.what());
      return HUGE_VAL;
    }
    const std::array<FusedForward*, 2> pair{fa, &fb};
    const auto visits = tools::paired_rounds(pair, args.rounds, /*mirrored=*/true, [&](FusedForward& f) {
      return tools::ForwardTiming{NAN, tools::time_back_to_back(f, tensors, args.iterations, 1), NAN};
    });
    return tools::median(tools::round_ratios(visits, 0, 1, &tools::ForwardTiming::back_to_back_ms));
  };
  // The grid's factors scale the values the library picks for this layer
  // (the defaults' forward, which the walk starts from anyway).
  FusedForwardOptions picked = forwards.get({}, {}).options();
  std::map<std::string, int> library;
  for (const auto& [name, values] : default_grid()) library[name] = *option_field(picked, name);
  const Grid grid = resolve_grid(default_grid(), library);
  const SearchResult result = search({}, grid, compare, args.budget_s, 0.005, std::ref(progress));
  progress.finish();

  std::printf("%s\n", table(result).c_str());
  for (const auto& [set, why] : refused) std::printf("refused %s: %s\n", describe(set).c_str(), why.c_str());
  json::Value facts = json::Value::object();
  facts.set("speedup", json::Value::number(result.speedup));
  facts.set("tuning_seconds", json::Value::number(result.seconds));
  facts.set("tool", json::Value::string("mok_cli tune"));
  cache.store(key, result.best, facts);
  std::printf("mok_cli tune: stored for %s in %s\n", key.id().c_str(), cache.path().c_str());
  return 0;
}

}  // namespace mok::tune
