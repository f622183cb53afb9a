// mok_gemm_bench: times mok's grouped GEMM alone (bf16 or block-scaled FP8,
// plain or SwiGLU epilogue), or its grouped weight-gradient GEMM, on one
// shape with random operands, and prints the time and the useful TFLOP/s. It is the C++ target for profilers (ncu
// on one launch: --iterations 1 --warmup 0) and for comparing builds; the
// Python benchmarks (bench/bench_grouped_gemm*.py) add the torch baselines
// and the correctness checks.
//
//   mok_gemm_bench [--element bf16|fp8] [--epilogue plain|swiglu|swiglu-quantize]
//                  [--groups G] [--rows R] [--n N] [--k K]
//                  [--warmup W] [--iterations I] [--ctas C] [--multicast | --split-n]
//   mok_gemm_bench --weight-grad fp32|bf16|accumulate [--groups G] [--rows R] [--n N] [--k K] ...
//
// Defaults: the DeepSeek-V3 slice's gate/up GEMM (32 groups of 1024 rows,
// n = 4096 weight rows, k = 7168), FP8, plain epilogue. With --epilogue
// swiglu, n is the output width and b holds 2n rows. With --weight-grad,
// each group's [k, n] gradient sums over its rows (a [rows, k], b [rows, n]),
// written as fp32, bf16, or added to an fp32 buffer. --split-n times the
// FP8 plain GEMM's split-N 64 x 256 tile (GroupedGemmArgs::fp8_split_n; n a
// multiple of 256) instead of the 128 x 128 one; the DeepSeek-V3 down shape:
//   mok_gemm_bench --element fp8 --n 7168 --k 2048 [--split-n]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/cuda_check.hpp"
#include "mok/error.hpp"
#include "mok/grouped_gemm.hpp"
#include "mok/weight_grad.hpp"

namespace {

struct Options {
  bool fp8 = true;
  bool swiglu = false;
  bool quantize = false;  // swiglu-quantize: FP8 h and its scales (kSwiGLUQuantize)
  bool multicast = false;  // --multicast: the FP8 plain GEMM's 2-CTA variant (GroupedGemmArgs::fp8_multicast)
  bool split_n = false;    // --split-n: the FP8 plain GEMM's split-N 64 x 256 tile (GroupedGemmArgs::fp8_split_n)
  int groups = 32;
  int rows = 1024;  // per group
  int64_t n = 4096;
  int64_t k = 7168;
  int warmup = 3;
  int iterations = 20;
  int ctas = 0;
  std::string weight_grad;  // empty: the grouped GEMM; else fp32, bf16 or accumulate
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "mok_gemm_bench: %s\n"
               "usage: mok_gemm_bench [--element bf16|fp8] [--epilogue plain|swiglu|swiglu-quantize] [--groups G]\n"
               "                      [--rows R]\n"
               "                      [--n N] [--k K] [--warmup W] [--iterations I] [--ctas C]\n"
               "                      [--multicast | --split-n]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") usage("times one grouped GEMM shape");
    if (arg == "--multicast") {
      o.multicast = true;
      continue;
    }
    if (arg == "--split-n") {
      o.split_n = true;
      continue;
    }
    if (i + 1 >= argc) usage(("missing value after " + arg).c_str());
    const std::string value = argv[++i];
    const auto number = [&] { return std::stoll(value); };
    if (arg == "--element") {
      if (value != "bf16" && value != "fp8") usage("--element: bf16 or fp8");
      o.fp8 = value == "fp8";
    } else if (arg == "--epilogue") {
      if (value != "plain" && value != "swiglu" && value != "swiglu-quantize") {
        usage("--epilogue: plain, swiglu or swiglu-quantize (fp8 only)");
      }
      o.swiglu = value != "plain";
      o.quantize = value == "swiglu-quantize";
    } else if (arg == "--groups") o.groups = static_cast<int>(number());
    else if (arg == "--rows") o.rows = static_cast<int>(number());
    else if (arg == "--n") o.n = number();
    else if (arg == "--k") o.k = number();
    else if (arg == "--warmup") o.warmup = static_cast<int>(number());
    else if (arg == "--iterations") o.iterations = static_cast<int>(number());
    else if (arg == "--ctas") o.ctas = static_cast<int>(number());
    else if (arg == "--weight-grad") {
      if (value != "fp32" && value != "bf16" && value != "accumulate") usage("--weight-grad: fp32, bf16 or accumulate");
      o.weight_grad = value;
    }
    else usage(("unknown option " + arg).c_str());
  }
  if (o.groups < 1 || o.rows < 1 || o.iterations < 1 || o.warmup < 0) usage("sizes and counts must be positive");
  if (o.quantize && !o.fp8) usage("--epilogue swiglu-quantize needs --element fp8");
  if (o.split_n && (!o.fp8 || o.swiglu || o.multicast || !o.weight_grad.empty())) {
    usage("--split-n: the FP8 plain GEMM's tile (--element fp8, --epilogue plain, not with --multicast)");
  }
  return o;
}

// A fast generator: the operands only need to be varied and finite.
struct XorShift {
  uint64_t s = 0x9E3779B97F4A7C15ull;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

// e4m3 bytes with magnitudes in [2^-3, 2^3): never NaN, never subnormal.
std::vector<uint8_t> random_e4m3(size_t count, XorShift& rng) {
  std::vector<uint8_t> v(count);
  for (auto& x : v) {
    const uint64_t r = rng.next();
    x = static_cast<uint8_t>(((r & 1) << 7) | ((4 + (r >> 8) % 6) << 3) | ((r >> 16) & 7));
  }
  return v;
}

// ue8m0 scales around 1 (2^-4 .. 2^0).
std::vector<uint8_t> random_scales(size_t count, XorShift& rng) {
  std::vector<uint8_t> v(count);
  for (auto& x : v) x = static_cast<uint8_t>(123 + rng.next() % 5);
  return v;
}

// bf16 bits with magnitudes in [2^-7, 1).
std::vector<uint16_t> random_bf16(size_t count, XorShift& rng) {
  std::vector<uint16_t> v(count);
  for (auto& x : v) {
    const uint64_t r = rng.next();
    x = static_cast<uint16_t>(((r & 1) << 15) | ((120 + (r >> 8) % 7) << 7) | ((r >> 16) & 127));
  }
  return v;
}

template <typename T>
T* upload(const std::vector<T>& host) {
  T* ptr = nullptr;
  MOK_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(host.size(), 1) * sizeof(T)));
  MOK_CUDA_CHECK(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return ptr;
}

// Median and minimum of `iterations` timed launches after `warmup` untimed ones.
template <class Launch>
std::pair<double, double> time_ms(const Options& o, const Launch& launch) {
  for (int i = 0; i < o.warmup; ++i) launch();
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  MOK_CUDA_CHECK(cudaEventCreate(&start));
  MOK_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms(static_cast<size_t>(o.iterations));
  for (auto& t : ms) {
    MOK_CUDA_CHECK(cudaEventRecord(start));
    launch();
    MOK_CUDA_CHECK(cudaEventRecord(stop));
    MOK_CUDA_CHECK(cudaEventSynchronize(stop));
    MOK_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
  }
  MOK_CUDA_CHECK(cudaEventDestroy(start));
  MOK_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front()};
}

struct Groups {
  int32_t* offset;
  int32_t* rows;
};

Groups upload_groups(const Options& o, std::vector<void*>& owned) {
  std::vector<int32_t> offset(static_cast<size_t>(o.groups) + 1), rows(static_cast<size_t>(o.groups), o.rows);
  for (int g = 0; g <= o.groups; ++g) offset[static_cast<size_t>(g)] = g * o.rows;
  Groups d{upload(offset), upload(rows)};
  owned.insert(owned.end(), {d.offset, d.rows});
  return d;
}

int run_weight_grad(const Options& o) {
  const int64_t m_total = static_cast<int64_t>(o.groups) * o.rows;
  XorShift rng;
  std::vector<void*> owned;
  const Groups groups = upload_groups(o, owned);
  mok::WeightGradArgs args;
  uint16_t* a = upload(random_bf16(static_cast<size_t>(m_total * o.k), rng));
  uint16_t* b = upload(random_bf16(static_cast<size_t>(m_total * o.n), rng));
  void* out = nullptr;
  const size_t out_count = static_cast<size_t>(o.groups) * static_cast<size_t>(o.k * o.n);
  MOK_CUDA_CHECK(cudaMalloc(&out, out_count * (o.weight_grad == "bf16" ? 2 : 4)));
  MOK_CUDA_CHECK(cudaMemset(out, 0, out_count * (o.weight_grad == "bf16" ? 2 : 4)));
  owned.insert(owned.end(), {a, b, out});
  args.a = a;
  args.b = b;
  if (o.weight_grad == "bf16") {
    args.out_bf16 = out;
  } else {
    args.out = static_cast<float*>(out);
  }
  args.accumulate = o.weight_grad == "accumulate";
  args.group_offset = groups.offset;
  args.group_rows = groups.rows;
  args.num_groups = o.groups;
  args.m_total = m_total;
  args.m = o.k;
  args.n = o.n;
  args.max_ctas = o.ctas;
  mok::validate_weight_grad(args);
  const auto [median, best] = time_ms(o, [&] { mok::grouped_weight_grad(args); });
  const double flops = 2.0 * static_cast<double>(m_total) * static_cast<double>(o.k) * static_cast<double>(o.n);
  const double out_bytes = static_cast<double>(out_count) * (o.weight_grad == "bf16" ? 2 : o.weight_grad == "fp32" ? 4 : 8);
  std::printf("weight grad (%s out): %d groups x %d rows, [%lld x %lld] each: %.3f ms (median of %d, min %.3f), "
              "%.0f TFLOP/s, output %.2f GB (%.2f TB/s if alone)\n",
              o.weight_grad.c_str(), o.groups, o.rows, static_cast<long long>(o.k), static_cast<long long>(o.n), median,
              o.iterations, best, flops / median / 1e9, out_bytes / 1e9, out_bytes / median / 1e9);
  for (void* p : owned) MOK_CUDA_CHECK(cudaFree(p));
  return 0;
}

int run(const Options& o) {
  if (!o.weight_grad.empty()) return run_weight_grad(o);
  const int64_t m_total = static_cast<int64_t>(o.groups) * o.rows;
  const int64_t b_rows = o.swiglu ? 2 * o.n : o.n;
  XorShift rng;
  std::vector<void*> owned;
  const Groups groups = upload_groups(o, owned);
  mok::GroupedGemmArgs args;
  args.element = o.fp8 ? mok::GemmElement::kE4M3 : mok::GemmElement::kBF16;
  args.epilogue = o.quantize ? mok::GemmEpilogue::kSwiGLUQuantize
                 : o.swiglu ? mok::GemmEpilogue::kSwiGLU
                            : mok::GemmEpilogue::kPlain;
  const size_t a_count = static_cast<size_t>(m_total * o.k), b_count = static_cast<size_t>(o.groups * b_rows * o.k);
  if (o.fp8) {
    uint8_t* a = upload(random_e4m3(a_count, rng));
    uint8_t* b = upload(random_e4m3(b_count, rng));
    uint8_t* a_scales = upload(random_scales(static_cast<size_t>(m_total * (o.k / 128)), rng));
    uint8_t* b_scales = upload(random_scales(static_cast<size_t>(o.groups * (b_rows / 128) * (o.k / 128)), rng));
    owned.insert(owned.end(), {a, b, a_scales, b_scales});
    args.a = a;
    args.b = b;
    args.a_scales = a_scales;
    args.b_scales = b_scales;
  } else {
    uint16_t* a = upload(random_bf16(a_count, rng));
    uint16_t* b = upload(random_bf16(b_count, rng));
    owned.insert(owned.end(), {a, b});
    args.a = a;
    args.b = b;
  }
  void* out = nullptr;
  MOK_CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(m_total * o.n) * 2));
  owned.push_back(out);
  args.out = out;
  if (o.quantize) {  // e4m3 h in the first half of out's bytes, its scales beside
    uint8_t* out_scales = nullptr;
    MOK_CUDA_CHECK(cudaMalloc(&out_scales, static_cast<size_t>(m_total * (o.n / 128))));
    owned.push_back(out_scales);
    args.out_scales = out_scales;
  }
  args.group_offset = groups.offset;
  args.group_rows = groups.rows;
  args.num_groups = o.groups;
  args.m_total = m_total;
  args.n = o.n;
  args.k = o.k;
  args.max_ctas = o.ctas;
  args.fp8_multicast = o.multicast;
  args.fp8_split_n = o.split_n;
  mok::validate_grouped_gemm(args);
  const auto [median, best] = time_ms(o, [&] { mok::grouped_gemm(args); });
  const double flops = 2.0 * static_cast<double>(m_total) * static_cast<double>(b_rows) * static_cast<double>(o.k);
  std::printf("%s %s%s: %d groups x %d rows, n %lld (b rows %lld), k %lld: %.3f ms (median of %d, min %.3f), %.0f TFLOP/s\n",
              o.fp8 ? "fp8" : "bf16", o.quantize ? "swiglu-quantize" : o.swiglu ? "swiglu" : "plain",
              o.multicast ? " (multicast)" : o.split_n ? " (split-n 64x256)" : "", o.groups, o.rows,
              static_cast<long long>(o.n),
              static_cast<long long>(b_rows), static_cast<long long>(o.k), median, o.iterations, best,
              flops / median / 1e9);
  for (void* p : owned) MOK_CUDA_CHECK(cudaFree(p));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mok_gemm_bench: %s\n", e.what());
    return 1;
  }
}
