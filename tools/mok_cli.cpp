// mok_cli: runs one MoE layer on a preset and reports what it did.
//
// With a Hopper GPU (and a CUDA build) it runs the fused forward megakernel on
// synthetic data, times it and, where the CPU can afford it, checks it against
// the CPU reference. Without one it says so and runs the CPU reference
// (forward, optionally backward). Every phase prints its time. With --fp8,
// the same for the fused FP8 forward (forward only), timed against the
// fused bf16 forward of the same layer.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "layer_dims.hpp"
#include "mok/error.hpp"
#include "mok/fused_forward.hpp"  // host-only: the options and their defaults, in every build
#include "mok/presets.hpp"
#include "mok/reference.hpp"
#include "mok/schedule.hpp"
#include "mok/synthetic.hpp"
#include "routing_mode.hpp"
#include "tune/option_set.hpp"
#include "tune/tune_args.hpp"

#if defined(MOK_HAVE_CUDA)
#include <cuda_runtime.h>

#include <memory>

#include "common/cuda_check.hpp"
#include "backward_timing.hpp"
#include "trace_csv.hpp"
#include "forward_timing.hpp"
#include "gpu_energy.hpp"
#include "mok/bf16.hpp"
#include "mok/device_layer.hpp"
#include "tune/tune_gpu.hpp"
#include "world/fp8_weights.hpp"
#endif

namespace {

struct Options {
  std::string preset;                // default: deepseek-v3-ep8-slice on a GPU, small on the CPU
  mok::tools::LayerDims dims;        // --hidden, --intermediate, ...: the preset's dims overridden
  int world_size = 0;                // default: 1 on a GPU, 2 on the CPU
  std::vector<int> tokens_per_rank;  // empty: `tokens` on every rank
  int tokens = 0;                    // default: 4096 on a GPU, 256 on the CPU
  std::string routing = "uniform";
  uint64_t seed = 1;
  int threads = 2;
  int tile_rows = mok::ScheduleOptions{}.tile_rows;  // the CPU path's schedule padding
  bool fp64 = false;
  bool backward = false;
  bool train = false;  // also time the forward's training mode (keeps gate/up for the backward)
  bool cpu = false;  // force the CPU reference even where a GPU exists
  bool fp8 = false;  // the layer in FP8 (LayerConfig::dtype kFP8E4M3): forward only
  int iterations = 20;
  mok::FusedForwardOptions forward;  // --minibatch-rows, --ring-slots, --comm-ctas, --lookahead
  std::string trace_file;  // non-empty: also trace one pass, summarise it, write its events here (CSV)
  // --compare: option sets timed against the base options in the same
  // process, on the same data, in `rounds` mirrored rounds (a b b a: the power
  // state one pass leaves the next, and a drift within a round, favour none).
  std::vector<std::string> compare;
  int rounds = 3;
};

void print_usage() {
  const mok::FusedForwardOptions defaults;
  std::printf(
      "usage: mok_cli [options]\n"
      "       mok_cli tune [options]   (find and cache the fastest tuning options: mok_cli tune --help)\n"
      "  With a Hopper GPU: runs the fused forward (virtual world of R ranks on one GPU),\n"
      "  times it, and checks it against the CPU reference when that is affordable.\n"
      "  Without one (or with --cpu): runs the CPU reference.\n"
      "  --preset NAME          layer shape (GPU default deepseek-v3-ep8-slice, CPU default small;\n"
      "                         --list-presets shows all)\n"
      "%s"
      "  --world R              expert-parallel ranks, 1..8 (GPU default 1, CPU default 2)\n"
      "  --tokens T             tokens on every rank (GPU default 4096, CPU default 256)\n"
      "  --tokens-per-rank a,b  a different count per rank (sets --world)\n"
      "  --routing MODE         uniform | skewed | same (default uniform)\n"
      "  --seed S               synthetic data seed (default 1)\n"
      "  --threads N            host threads for the reference (default 2)\n"
      "  --tile-rows N          schedule padding per expert on the CPU path (default 128; the\n"
      "                         GPU passes pad to their own tiles)\n"
      "  --fp64                 run the reference in fp64 (no bf16 rounding)\n"
      "  --backward             also run the backward: on a GPU the fused backward (save mode; time,\n"
      "                         useful TFLOP/s, energy per pass (NVML), where a traced pass's time\n"
      "                         goes, gradient bits, the CPU reference on small layers;\n"
      "                         then recompute mode: its time against save mode's, the bytes each\n"
      "                         mode keeps per layer, and whether its gradient bits are the same),\n"
      "                         on the CPU the reference backward\n"
      "  --cpu                  run the CPU reference even where a GPU exists\n"
      "  --fp8                  the FP8 forward (block-scaled e4m3 routed experts; forward only): on a\n"
      "                         GPU the fused FP8 forward (routed weights quantized on the host, x by\n"
      "                         the kernel), timed in --rounds mirrored rounds against the fused bf16\n"
      "                         forward of the same layer and data (ratio), checked against the CPU\n"
      "                         reference's FP8 recipe on small layers; on the CPU, that reference\n"
      "                         forward alone\n"
      "  --iterations N         timed GPU runs (default 20)\n"
      "  --minibatch-rows N     fused forward minibatch (default %d)\n"
      "  --ring-slots N         fused forward ring slots (default %d)\n"
      "  --lookahead N          gate/up minibatches ahead of the down tasks (default %d)\n"
      "  --ctas-per-rank N      SMs per rank (default: all SMs / R)\n"
      "  --comm-ctas-per-rank N dispatch CTAs per rank (default: from the layer's bytes per FLOP;\n"
      "                         --comm-ctas is the same)\n"
      "  --trace FILE           also trace one pass: print where its time went, write its events (CSV);\n"
      "                         with --backward, the backward's pass\n"
      "  --compare SET          also time the fused forward with SET, a comma-separated list of\n"
      "                         minibatch-rows=N, ring-slots=N, lookahead=N, ctas-per-rank=N,\n"
      "                         comm-ctas-per-rank=N (or comm-ctas=N), against\n"
      "                         the options above, in mirrored rounds in one process on the same data\n"
      "                         (repeatable; the clock drifts, so only ratios within a round count)\n"
      "  --rounds N             alternations for --compare and --fp8 (default 3)\n"
      "  --train                also time the training-mode forward (it keeps each row's gate/up\n"
      "                         pre-activations for the backward) against the inference one\n"
      "  --list-presets         print the presets and exit\n",
      mok::tools::layer_dims_usage().c_str(), defaults.minibatch_rows, defaults.ring_slots, defaults.lookahead);
}

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> values;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) values.push_back(std::stoi(item));
  return values;
}

// The fused forward's tuning option named `key`: a field of
// MOK_FOR_EACH_TUNING_OPTION with dashes for underscores (the CLI's flag
// without its leading dashes, the name --compare takes too), or comm-ctas,
// the older name of comm-ctas-per-rank; null for an unknown key.
int* tuning_option(mok::FusedForwardOptions& options, const std::string& key) {
  if (key.find('_') != std::string::npos) return nullptr;  // the CLI's names have dashes only
  std::string name = key == "comm-ctas" ? "comm_ctas_per_rank" : key;
  std::replace(name.begin(), name.end(), '-', '_');
  return mok::tune::option_field(options, name);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw mok::Error("option " + arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") { print_usage(); std::exit(0); }
    else if (arg == "--list-presets") {
      for (const mok::LayerShape& s : mok::layer_shapes()) {
        std::printf("%-24s H=%-5d I=%-5d E=%-4d top_k=%d shared=%d  %s\n", s.name, s.hidden,
                    s.intermediate, s.num_experts, s.top_k, s.num_shared_experts, s.note);
      }
      std::exit(0);
    }
    else if (arg == "--preset") o.preset = value();
    else if (mok::tools::is_layer_dim_flag(arg)) mok::tools::parse_layer_dim(o.dims, "mok_cli", arg, value());
    else if (arg == "--world") o.world_size = std::stoi(value());
    else if (arg == "--tokens") o.tokens = std::stoi(value());
    else if (arg == "--tokens-per-rank") o.tokens_per_rank = parse_list(value());
    else if (arg == "--routing") o.routing = value();
    else if (arg == "--seed") o.seed = std::stoull(value());
    else if (arg == "--threads") o.threads = std::stoi(value());
    else if (arg == "--tile-rows") o.tile_rows = std::stoi(value());
    else if (arg == "--fp64") o.fp64 = true;
    else if (arg == "--backward") o.backward = true;
    else if (arg == "--train") o.train = true;
    else if (arg == "--cpu") o.cpu = true;
    else if (arg == "--fp8") o.fp8 = true;
    else if (arg == "--iterations") o.iterations = std::stoi(value());
    else if (int* option = arg.rfind("--", 0) == 0 ? tuning_option(o.forward, arg.substr(2)) : nullptr) {
      *option = std::stoi(value());
    }
    else if (arg == "--trace") o.trace_file = value();
    else if (arg == "--compare") o.compare.push_back(value());
    else if (arg == "--rounds") o.rounds = std::stoi(value());
    else throw mok::Error("unknown option '" + arg + "' (see --help)");
  }
  return o;
}

using mok::tools::routing_mode;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Sum of |v| over every rank's output: a fingerprint to compare runs by eye.
double checksum(const std::vector<std::vector<double>>& per_rank) {
  double sum = 0;
  for (const auto& rank : per_rank) {
    for (double v : rank) sum += std::fabs(v);
  }
  return sum;
}

mok::LayerConfig make_config(const Options& o) {
  const mok::LayerShape& shape = mok::find_shape(o.preset);
  const mok::DType dtype = o.fp8 ? mok::DType::kFP8E4M3 : mok::DType::kBF16;
  const mok::LayerConfig config =
      mok::tools::config_with_dims("mok_cli", o.preset, o.dims, o.world_size, o.tokens, o.tokens_per_rank, dtype);
  std::printf("mok_cli: preset %s (%s)%s\n  %s\n", shape.name, shape.note,
              mok::tools::describe_overrides(o.dims).c_str(), mok::describe(config).c_str());
  return config;
}

int run_cpu(const Options& o) {
  if (o.fp8 && (o.backward || o.fp64)) {
    throw mok::Error("--fp8: the CPU reference computes the FP8 recipe forward only, in fp32 (its rounding is "
                     "fp32's): drop --backward and --fp64");
  }
  const mok::LayerConfig config = make_config(o);

  auto start = std::chrono::steady_clock::now();
  const mok::synthetic::Layer layer = mok::synthetic::make_layer(config, o.seed, routing_mode(o.routing));
  std::printf("[1/3] synthetic data (seed %llu, %s routing): %.3f s\n",
              static_cast<unsigned long long>(o.seed), o.routing.c_str(), seconds_since(start));

  start = std::chrono::steady_clock::now();
  const auto routing = layer.routing();
  const mok::WorldSchedule schedule = mok::build_schedule(config, routing, {o.tile_rows, o.threads});
  std::printf("[2/3] schedule (tile_rows %d): %.3f s\n", o.tile_rows, seconds_since(start));
  for (const mok::RankSchedule& rank : schedule.ranks) {
    int32_t busiest = 0, real = 0;
    for (int32_t rows : rank.expert_rows) {
      busiest = std::max(busiest, rows);
      real += rows;
    }
    std::printf("      rank %d: experts %d..%d, %d rows (%d padded), busiest expert %d rows\n", rank.rank,
                rank.first_expert, rank.first_expert + rank.num_local_experts - 1, real,
                rank.padded_rows(), busiest);
  }

  const mok::LayerInputs inputs = layer.inputs();
  mok::ReferenceOptions ref_options;
  ref_options.precision = o.fp64 ? mok::RefPrecision::kFP64 : mok::RefPrecision::kFP32;
  ref_options.num_threads = o.threads;
  start = std::chrono::steady_clock::now();
  const mok::ReferenceForward forward = mok::reference_forward(inputs, schedule, ref_options);
  const double forward_s = seconds_since(start);
  const double flops = config.forward_flops();
  std::printf("[3/3] reference forward (%s, %d threads): %.3f s, %.2f GFLOP useful, %.2f GFLOP/s, checksum %.6e\n",
              o.fp8 ? "fp8 recipe, fp32" : o.fp64 ? "fp64" : "fp32", o.threads, forward_s, flops * 1e-9,
              flops * 1e-9 / forward_s, checksum(forward.out));

  if (o.backward) {
    const auto dout = mok::synthetic::random_dout(config, o.seed + 1);
    const auto dout_views = mok::synthetic::rank_pointers(dout);
    start = std::chrono::steady_clock::now();
    const mok::ReferenceBackward backward = mok::reference_backward(inputs, schedule, dout_views, ref_options);
    const double backward_s = seconds_since(start);
    std::printf("[+] reference backward: %.3f s, %.2f GFLOP useful, dx checksum %.6e\n", backward_s,
                2 * flops * 1e-9, checksum(backward.dx));
  }
  return 0;
}

#if defined(MOK_HAVE_CUDA)
using mok::tools::ForwardTiming;
using mok::tools::time_forward;

// About a second of passes back to back, measured by NVML: energy per pass
// and per useful FLOP, mean power and SM clock (the H200 trades clock for
// power at its cap; docs/perf-notes.md, "The power cap").
void report_energy(mok::FusedForward& forward, const mok::DeviceLayer& device, double pass_ms, double flops) {
  mok::tools::report_energy("      ", pass_ms, flops, [&] { forward.run(device.tensors()); });
  forward.check();
}

// One traced pass (after a warm-up one) with the same options: prints the
// summary and writes every event as CSV for a timeline plot.
void trace_pass(const mok::LayerConfig& config, mok::FusedForwardOptions options,
                const std::vector<mok::RankTensors>& tensors, const std::string& path) {
  options.trace_events = 1 << 20;
  mok::FusedForward traced(config, options);
  traced.run(tensors);
  traced.run(tensors);
  const std::vector<mok::TraceEvent> events = traced.trace();
  std::printf("      trace of one pass (%zu events):\n%s", events.size(),
              mok::describe(mok::summarize_trace(events)).c_str());
  mok::tools::write_trace_csv(events, path);
  std::printf("      events written to %s\n", path.c_str());
}

// The base options changed by one --compare set ("ring-slots=3,minibatch-rows=768").
mok::FusedForwardOptions apply_set(mok::FusedForwardOptions options, const std::string& set) {
  std::stringstream stream(set);
  std::string item;
  while (std::getline(stream, item, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) throw mok::Error("--compare '" + set + "': expected key=value, got '" + item + "'");
    const std::string key = item.substr(0, eq);
    int* option = tuning_option(options, key);
    if (option == nullptr) throw mok::Error("--compare '" + set + "': unknown key '" + key + "' (see --help)");
    *option = std::stoi(item.substr(eq + 1));
  }
  return options;
}

// The base options and every --compare set, timed in turn for o.rounds
// rounds (forward_timing.hpp's paired rounds); prints each timing and the
// median ratio to the base per set.
void compare_options(const Options& o, const mok::LayerConfig& config, const mok::FusedForwardOptions& base,
                     mok::FusedForward& base_forward, const mok::DeviceLayer& device) {
  std::vector<std::string> labels{"base"};
  std::vector<std::unique_ptr<mok::FusedForward>> owned;
  std::vector<mok::FusedForward*> forwards{&base_forward};
  for (const std::string& set : o.compare) {
    owned.push_back(std::make_unique<mok::FusedForward>(config, apply_set(base, set)));
    forwards.push_back(owned.back().get());
    labels.push_back(set);
  }
  const double flops = config.forward_flops();
  std::printf("[+] comparing %zu option sets, %d rounds of %d passes each (ratio = base time / set time)\n",
              forwards.size(), o.rounds, o.iterations);
  const auto visits = mok::tools::paired_rounds(
      forwards, o.rounds, /*mirrored=*/true,
      [&](mok::FusedForward& forward) { return time_forward(forward, device.tensors(), o.iterations); },
      [&](const mok::tools::Visit& v) {
        std::printf("    round %d  %-40s %.3f ms alone (passes %.3f-%.3f), %.3f back to back, %.1f useful TFLOP/s\n",
                    v.round + 1, labels[v.index].c_str(), v.timing.pass_ms, v.timing.fastest_ms, v.timing.slowest_ms,
                    v.timing.back_to_back_ms, flops / v.timing.pass_ms * 1e-9);
        report_energy(*forwards[v.index], device, v.timing.back_to_back_ms, flops);
      });
  for (size_t i = 1; i < forwards.size(); ++i) {
    using mok::tools::median;
    using mok::tools::round_ratios;
    std::printf("    %-40s median ratio to base: %.3f alone, %.3f back to back\n", labels[i].c_str(),
                median(round_ratios(visits, 0, i, &ForwardTiming::pass_ms)),
                median(round_ratios(visits, 0, i, &ForwardTiming::back_to_back_ms)));
  }
}

// The training-mode forward: each rank keeps its schedule (pass state) and
// the gate/up pre-activations of its routed rows and shared expert in buffers
// of its own; timed like the inference pass, and its output bits compared.
void time_training_forward(mok::FusedForward& forward, mok::DeviceLayer& device, const mok::LayerConfig& config,
                           const ForwardTiming& inference, int iterations) {
  std::vector<mok::RankTensors> tensors = device.tensors();
  std::vector<void*> buffers;
  size_t kept = 0;
  for (size_t r = 0; r < tensors.size(); ++r) {
    const size_t T = static_cast<size_t>(config.tokens_per_rank[r]);
    const size_t routed = static_cast<size_t>(forward.saved_rows()) * 2 * config.intermediate * 2;
    const size_t shared = T * 2 * static_cast<size_t>(config.shared_width()) * 2;
    void *state = nullptr, *preact = nullptr, *shared_preact = nullptr;
    MOK_CUDA_CHECK(cudaMalloc(&state, forward.pass_state_bytes()));
    MOK_CUDA_CHECK(cudaMalloc(&preact, routed));
    if (shared > 0) MOK_CUDA_CHECK(cudaMalloc(&shared_preact, shared));
    buffers.insert(buffers.end(), {state, preact, shared_preact});
    tensors[r].pass_state = state;
    tensors[r].preact = preact;
    tensors[r].shared_preact = shared_preact;
    kept = std::max(kept, forward.pass_state_bytes() + routed + shared);
  }
  const std::vector<uint16_t> inference_out = device.download_outputs();
  const ForwardTiming t = time_forward(forward, tensors, iterations);
  device.poison_outputs();
  forward.run(tensors);
  forward.check();
  const bool same = device.download_outputs() == inference_out;
  std::printf("      training forward (keeps gate/up, %.1f MB per rank): %.3f ms (median), back to back %.3f ms: "
              "%.3fx the inference pass; output bits %s\n",
              static_cast<double>(kept) / 1e6, t.pass_ms, t.back_to_back_ms, t.back_to_back_ms / inference.back_to_back_ms,
              same ? "the same" : "DIFFERENT");
  for (void* p : buffers) {
    if (p != nullptr) MOK_CUDA_CHECK(cudaFree(p));
  }
}

// One more pass on poisoned outputs, and a hash of every output bit: two
// builds (or option sets) that print the same hash computed the same bits.
void print_output_bits(mok::FusedForward& forward, mok::DeviceLayer& device,
                       const std::vector<mok::RankTensors>& tensors) {
  device.poison_outputs();
  forward.run(tensors);
  forward.check();
  const std::vector<uint16_t> out = device.download_outputs();
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64-bit
  for (uint16_t v : out) {
    h = (h ^ (v & 0xffu)) * 1099511628211ull;
    h = (h ^ (v >> 8)) * 1099511628211ull;
  }
  std::printf("      output bits: fnv1a64 %016llx over %zu bf16 values\n", static_cast<unsigned long long>(h),
              out.size());
}

// How far an FP8 output is from the CPU reference's FP8 recipe: the
// relative L2 error, the largest difference and the share of elements off by
// more than 0.02, both in units of the reference's RMS. The same bounds as
// tests/gpu/test_fused_forward_fp8.cpp (which argues them): the kernel and
// the reference quantize x and the weights to the same bytes, and only the
// GEMMs' summation order differs, which now and then flips one h value's
// e4m3 rounding (or a block's scale) between the GEMMs.
// The CPU reference costs about a second per 5 GFLOP on two cores: the
// forward is checked against it only where it can afford the layer.
bool reference_affordable(double flops) {
  if (flops <= 2e10) return true;
  std::printf("[3/3] reference check skipped: %.0f GFLOP is too much for the CPU reference "
              "(the GPU tests check small presets)\n", flops * 1e-9);
  return false;
}

// One pass over poisoned outputs (so that an unwritten element shows), read back.
template <class Tensors>
std::vector<uint16_t> run_poisoned(mok::FusedForward& forward, mok::DeviceLayer& device, const Tensors& tensors) {
  device.poison_outputs();
  forward.run(tensors);
  forward.check();
  return device.download_outputs();
}

// The CPU reference's forward of the synthetic layer (its dtype's recipe).
mok::ReferenceForward reference_of(const mok::synthetic::Layer& layer, const mok::LayerConfig& config, int threads) {
  const mok::WorldSchedule schedule =
      mok::build_schedule(config, layer.routing(), {mok::ScheduleOptions{}.tile_rows, threads});
  mok::ReferenceOptions options;
  options.num_threads = threads;
  return mok::reference_forward(layer.inputs(), schedule, options);
}

bool check_fp8_against_reference(const std::vector<uint16_t>& out, const mok::ReferenceForward& ref) {
  double ref2 = 0;
  size_t count = 0;
  for (const auto& rank : ref.out) {
    for (double v : rank) ref2 += v * v;
    count += rank.size();
  }
  const double rms = std::sqrt(ref2 / static_cast<double>(std::max<size_t>(count, 1)));
  double worst = 0;
  size_t far = 0, i = 0, unwritten = 0;
  for (const auto& rank : ref.out) {
    for (double want : rank) {
      const double got = mok::bf16_bits_to_float(out.at(i++));
      if (std::isnan(got)) {
        ++unwritten;
        continue;
      }
      const double diff = std::fabs(got - want) / rms;
      worst = std::max(worst, diff);
      far += diff > 0.02;
    }
  }
  const double rel = mok::relative_l2_error(out, ref.out);
  const double far_share = static_cast<double>(far) / static_cast<double>(std::max<size_t>(count, 1));
  const bool ok = unwritten == 0 && rel < 1e-2 && worst <= 0.25 && far_share <= 0.01;
  std::printf("[3/3] vs the CPU reference's FP8 recipe: relative L2 error %.2e, max |diff| %.3f x rms, %.4f%% of "
              "elements beyond 0.02 x rms, %zu unwritten (%s)\n",
              rel, worst, far_share * 100, unwritten, ok ? "ok" : "TOO LARGE");
  return ok;
}

// mok_cli --fp8 with a GPU: the fused FP8 forward on the layer's synthetic
// data (its routed weights quantized on the host with
// mok::fp8::quantize_weight; x stays bf16, the kernel quantizes it), timed
// against the fused bf16 forward of the same layer and data in mirrored
// paired rounds (a b b a: a clock drifting within a round favours neither),
// then checked against the CPU reference where that is affordable.
int run_gpu_fp8(const Options& o) {
  if (o.backward || o.train || !o.compare.empty()) {
    throw mok::Error("--fp8 runs the fused FP8 forward only: --backward, --train and --compare are the bf16 "
                     "forward's");
  }
  const mok::LayerConfig config = make_config(o);
  auto start = std::chrono::steady_clock::now();
  const mok::synthetic::Layer layer = mok::synthetic::make_layer(config, o.seed, routing_mode(o.routing));
  mok::DeviceLayer device(layer);
  const mok::world::Fp8RoutedWeights weights(layer);
  const std::vector<mok::RankTensors> fp8_tensors = weights.apply(device.tensors());
  mok::FusedForward forward(config, o.forward);
  std::printf("[1/3] synthetic data (seed %llu, %s routing) on the GPU, routed weights in FP8, workspace: %.3f s\n"
              "      %s\n",
              static_cast<unsigned long long>(o.seed), o.routing.c_str(), seconds_since(start),
              forward.options().describe().c_str());

  // The bf16 forward of the same layer and data, with the same options where
  // it takes them (both run 128-row tiles).
  mok::LayerConfig bf16_config = config;
  bf16_config.dtype = mok::DType::kBF16;
  std::unique_ptr<mok::FusedForward> bf16;
  try {
    bf16 = std::make_unique<mok::FusedForward>(bf16_config, o.forward);
  } catch (const mok::Error& e) {
    std::printf("      (no bf16 comparison: %s)\n", e.what());
  }
  std::vector<mok::FusedForward*> forwards{&forward};
  if (bf16) forwards.push_back(bf16.get());
  const char* labels[] = {"fp8", "bf16"};
  const double flops = config.forward_flops();
  const auto visits = mok::tools::paired_rounds(
      forwards, o.rounds, /*mirrored=*/true,
      [&](mok::FusedForward& f) { return time_forward(f, &f == &forward ? fp8_tensors : device.tensors(), o.iterations); },
      [&](const mok::tools::Visit& v) {
        std::printf("    round %d  %-5s %.3f ms alone (passes %.3f-%.3f), %.3f back to back, %.1f useful TFLOP/s\n",
                    v.round + 1, labels[v.index], v.timing.pass_ms, v.timing.fastest_ms, v.timing.slowest_ms,
                    v.timing.back_to_back_ms, flops / v.timing.pass_ms * 1e-9);
      });
  std::vector<double> fp8_ms;
  for (const mok::tools::Visit& v : visits) {
    if (v.index == 0) fp8_ms.push_back(v.timing.pass_ms);
  }
  const double fp8_median = mok::tools::median(fp8_ms);
  std::printf("[2/3] fused FP8 forward: %.3f ms (median over %d rounds of %d passes), %.1f useful TFLOP/s\n",
              fp8_median, o.rounds, o.iterations, flops / fp8_median * 1e-9);
  if (bf16) {
    using mok::tools::median;
    using mok::tools::round_ratios;
    std::printf("      FP8 speedup over the fused bf16 forward (bf16 time / FP8 time, median of the rounds): "
                "%.3fx alone, %.3fx back to back\n",
                median(round_ratios(visits, 1, 0, &ForwardTiming::pass_ms)),
                median(round_ratios(visits, 1, 0, &ForwardTiming::back_to_back_ms)));
  }
  print_output_bits(forward, device, fp8_tensors);
  if (!o.trace_file.empty()) trace_pass(config, o.forward, fp8_tensors, o.trace_file);

  if (!reference_affordable(flops)) return 0;
  start = std::chrono::steady_clock::now();
  const std::vector<uint16_t> out = run_poisoned(forward, device, fp8_tensors);
  const bool ok = check_fp8_against_reference(out, reference_of(layer, config, o.threads));
  std::printf("      (reference: %.3f s)\n", seconds_since(start));
  return ok ? 0 : 1;
}

int run_gpu(const Options& o) {
  if (o.fp8) return run_gpu_fp8(o);
  const mok::LayerConfig config = make_config(o);
  auto start = std::chrono::steady_clock::now();
  const mok::synthetic::Layer layer = mok::synthetic::make_layer(config, o.seed, routing_mode(o.routing));
  mok::DeviceLayer device(layer);
  mok::FusedForward forward(config, o.forward);
  std::printf("[1/3] synthetic data (seed %llu, %s routing) on the GPU, workspace: %.3f s\n      %s\n",
              static_cast<unsigned long long>(o.seed), o.routing.c_str(), seconds_since(start),
              forward.options().describe().c_str());

  const ForwardTiming timing = time_forward(forward, device.tensors(), o.iterations);
  const double flops = config.forward_flops();
  std::printf("[2/3] fused forward: %.3f ms (median of %d), %.1f useful TFLOP/s; back to back %.3f ms per pass; "
              "host enqueue %.0f us\n",
              timing.pass_ms, o.iterations, flops / timing.pass_ms * 1e-9, timing.back_to_back_ms, timing.enqueue_us);
  report_energy(forward, device, timing.back_to_back_ms, flops);
  print_output_bits(forward, device, device.tensors());
  if (o.train) time_training_forward(forward, device, config, timing, o.iterations);
  if (o.backward && !mok::tools::run_backward(config, o.forward, layer, device, o.iterations, o.seed, o.threads, o.trace_file)) {
    return 1;
  }
  // With --backward, --trace is the backward's (written above).
  if (!o.trace_file.empty() && !o.backward) trace_pass(config, o.forward, device.tensors(), o.trace_file);
  if (!o.compare.empty()) compare_options(o, config, o.forward, forward, device);

  if (!reference_affordable(flops)) return 0;
  start = std::chrono::steady_clock::now();
  const std::vector<uint16_t> out = run_poisoned(forward, device, device.tensors());
  const mok::ReferenceForward ref = reference_of(layer, config, o.threads);
  const double rel = mok::relative_l2_error(out, ref.out);
  std::printf("[3/3] vs CPU reference: relative L2 error %.2e (%s), %.3f s\n", rel, rel < 1e-2 ? "ok" : "TOO LARGE",
              seconds_since(start));
  return rel < 1e-2 ? 0 : 1;
}
#endif

}  // namespace

// mok_cli tune: the tuner (tools/tune/). Exit status 2 where it cannot run.
int run_tune(int argc, char** argv) {
  const mok::tune::TuneArgs args = mok::tune::parse_tune_args(argc, argv);
  if (args.help) {
    std::printf("%s", mok::tune::tune_usage().c_str());
    return 0;
  }
#if defined(MOK_HAVE_CUDA)
  if (mok::detail::hopper_device_count() > 0) return mok::tune::run_tune_on_gpu(args);
  std::fprintf(stderr, "mok_cli tune: needs a Hopper GPU (none on this machine)\n");
#else
  std::fprintf(stderr, "mok_cli tune: needs a Hopper GPU and a CUDA build (this one has no CUDA)\n");
#endif
  return 2;
}

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::strcmp(argv[1], "tune") == 0) return run_tune(argc - 1, argv + 1);
    Options o = parse(argc, argv);
    bool gpu = false;
#if defined(MOK_HAVE_CUDA)
    gpu = !o.cpu && mok::detail::hopper_device_count() > 0;
#endif
    if (o.preset.empty()) o.preset = gpu ? "deepseek-v3-ep8-slice" : "small";
    if (o.world_size == 0) o.world_size = gpu ? 1 : 2;
    if (o.tokens == 0) o.tokens = gpu ? 4096 : 256;
#if defined(MOK_HAVE_CUDA)
    if (gpu) return run_gpu(o);
    std::printf("mok_cli: %s: running the CPU reference instead of the fused GPU forward\n",
                o.cpu ? "--cpu given" : "no Hopper GPU on this machine");
#else
    std::printf("mok_cli: built without CUDA: running the CPU reference\n");
#endif
    return run_cpu(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
