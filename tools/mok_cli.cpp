// mok_cli: runs one MoE layer on a preset and reports what it did.
//
// Today it builds the deterministic schedule and runs the CPU reference
// (forward, optionally backward) on synthetic data; the fused GPU forward
// joins it when the megakernel lands. Every phase prints its time.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "mok/error.hpp"
#include "mok/presets.hpp"
#include "mok/reference.hpp"
#include "mok/schedule.hpp"
#include "mok/synthetic.hpp"

namespace {

struct Options {
  std::string preset = "small";
  int world_size = 2;
  std::vector<int> tokens_per_rank;  // empty: `tokens` on every rank
  int tokens = 256;
  std::string routing = "uniform";
  uint64_t seed = 1;
  int threads = 2;
  int tile_rows = 128;
  bool fp64 = false;
  bool backward = false;
};

void print_usage() {
  std::printf(
      "usage: mok_cli [options]\n"
      "  --preset NAME          layer shape (default small; --list-presets shows all)\n"
      "  --world R              expert-parallel ranks, 1..8 (default 2)\n"
      "  --tokens T             tokens on every rank (default 256)\n"
      "  --tokens-per-rank a,b  a different count per rank (sets --world)\n"
      "  --routing MODE         uniform | skewed | same (default uniform)\n"
      "  --seed S               synthetic data seed (default 1)\n"
      "  --threads N            host threads for the reference (default 2)\n"
      "  --tile-rows N          schedule padding per expert (default 128)\n"
      "  --fp64                 run the reference in fp64 (no bf16 rounding)\n"
      "  --backward             also run the reference backward\n"
      "  --list-presets         print the presets and exit\n");
}

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> values;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) values.push_back(std::stoi(item));
  return values;
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
    else if (arg == "--world") o.world_size = std::stoi(value());
    else if (arg == "--tokens") o.tokens = std::stoi(value());
    else if (arg == "--tokens-per-rank") o.tokens_per_rank = parse_list(value());
    else if (arg == "--routing") o.routing = value();
    else if (arg == "--seed") o.seed = std::stoull(value());
    else if (arg == "--threads") o.threads = std::stoi(value());
    else if (arg == "--tile-rows") o.tile_rows = std::stoi(value());
    else if (arg == "--fp64") o.fp64 = true;
    else if (arg == "--backward") o.backward = true;
    else throw mok::Error("unknown option '" + arg + "' (see --help)");
  }
  return o;
}

mok::synthetic::RoutingMode routing_mode(const std::string& name) {
  if (name == "uniform") return mok::synthetic::RoutingMode::kUniform;
  if (name == "skewed") return mok::synthetic::RoutingMode::kSkewed;
  if (name == "same") return mok::synthetic::RoutingMode::kSameExperts;
  throw mok::Error("--routing " + name + ": expected uniform, skewed or same");
}

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

int run(const Options& o) {
  const mok::LayerShape& shape = mok::find_shape(o.preset);
  const mok::LayerConfig config =
      o.tokens_per_rank.empty() ? mok::make_config(shape, o.world_size, o.tokens)
                                : mok::make_config(shape, o.tokens_per_rank);
  std::printf("mok_cli: preset %s (%s)\n  %s\n", shape.name, shape.note, mok::describe(config).c_str());
  std::printf("  no GPU path yet: this runs the CPU reference (the fused GPU forward comes with issue 4)\n");

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
              o.fp64 ? "fp64" : "fp32", o.threads, forward_s, flops * 1e-9, flops * 1e-9 / forward_s,
              checksum(forward.out));

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

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
