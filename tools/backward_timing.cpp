#include "backward_timing.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <span>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu_energy.hpp"
#include "mok/bf16.hpp"
#include "mok/fused_backward.hpp"
#include "mok/pass_trace.hpp"
#include "mok/reference.hpp"
#include "mok/schedule.hpp"
#include "protocol/pass_backward.hpp"
#include "trace_csv.hpp"

namespace mok::tools {
namespace {

// A device buffer freed on scope exit (null for zero bytes).
struct Buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit Buffer(size_t n) : bytes(n) {
    if (n > 0) MOK_CUDA_CHECK(cudaMalloc(&ptr, n));
  }
  Buffer(Buffer&& o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { cudaFree(ptr); }
  template <class T>
  T* as() const { return static_cast<T*>(ptr); }
  template <class T>
  std::vector<T> download() const {
    std::vector<T> host(bytes / sizeof(T));
    if (bytes > 0) MOK_CUDA_CHECK(cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost));
    return host;
  }
};

// dout: uniform in [-1, 1), bf16, from a fixed generator (the same every run).
std::vector<float> random_dout(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (float& f : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    f = bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(static_cast<double>(static_cast<int64_t>(s >> 40) - (1ll << 23)) /
                                                                 static_cast<double>(1ll << 23))));
  }
  return v;
}

double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = i < got.size() ? got[i] : NAN;
    num += (g - want[i]) * (g - want[i]);
    den += want[i] * want[i];
  }
  return std::isfinite(num) ? std::sqrt(num / std::max(den, 1e-300)) : INFINITY;
}

template <class T>
void hash_into(uint64_t& h, const std::vector<T>& v) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(T); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
}

// FNV-1a 64 over every rank's gradients: per rank dx, dweights, dW13, dW2,
// shared dW13, shared dW2 (bufs: per rank dout, then those six).
constexpr uint64_t kFnvOffset = 1469598103934665603ull;
uint64_t hash_gradients(const std::vector<Buffer>& bufs, int R) {
  uint64_t h = kFnvOffset;
  for (int r = 0; r < R; ++r) {
    for (size_t j = 1; j < 7; ++j) hash_into(h, bufs[static_cast<size_t>(r) * 7 + j].download<uint8_t>());
  }
  return h;
}

// The names of a traced pass's GEMM kinds (a mainloop event's detail), in
// the order of the mode's protocol::BackwardPass::Kind or
// BackwardRecomputePass::Kind.
constexpr const char* kSaveKindNames[] = {"shared g + SwiGLU'", "shared dx", "g + SwiGLU'", "dx_j",
                                          "dW13",               "dW2",       "shared dW13", "shared dW2"};
constexpr const char* kRecomputeKindNames[] = {"shared gate/up", "shared g + SwiGLU'", "shared dx",  "gate/up", "g + SwiGLU'",
                                               "dx_j",           "dW13",               "dW2",        "shared dW13",
                                               "shared dW2"};
static_assert(std::size(kSaveKindNames) == protocol::BackwardPass::kNumKinds);
static_assert(std::size(kRecomputeKindNames) == protocol::BackwardRecomputePass::kNumKinds);
std::span<const char* const> kind_names(BackwardMode mode) {
  if (mode == BackwardMode::kRecompute) return kRecomputeKindNames;
  return kSaveKindNames;
}

// Where a traced pass's time went: per GEMM kind (kind_names[detail]), its
// tasks, their mean mainloop and epilogue, the sum of their input waits, and
// when the first began and the last ended (from the pass's first event); the
// same spans for the dispatch and the combine.
void print_trace_summary(const std::vector<TraceEvent>& events, std::span<const char* const> kind_names) {
  const int kKinds = static_cast<int>(kind_names.size());
  struct Span {
    uint64_t first = UINT64_MAX, last = 0;
    double sum_us[3] = {0, 0, 0};  // mainloop, epilogue, input wait
    int tasks = 0;
  };
  std::vector<Span> kinds(kind_names.size());
  Span dispatch, combine_wait, combine;
  uint64_t start = UINT64_MAX;
  for (const TraceEvent& e : events) start = std::min(start, e.begin_ns);
  auto widen = [](Span& s, const TraceEvent& e) {
    s.first = std::min(s.first, e.begin_ns);
    s.last = std::max(s.last, e.end_ns);
  };
  for (const TraceEvent& e : events) {
    const double us = static_cast<double>(e.end_ns - e.begin_ns) * 1e-3;
    const auto kind = static_cast<TraceKind>(e.kind);
    const bool gemm = e.detail >= 0 && e.detail < kKinds;
    Span* task = gemm ? &kinds[static_cast<size_t>(e.detail)] : nullptr;
    if (kind == TraceKind::kMainloop && gemm) {
      widen(*task, e);
      task->sum_us[0] += us;
      ++task->tasks;
    } else if (kind == TraceKind::kEpilogue && gemm) {
      widen(*task, e);
      task->sum_us[1] += us;
    } else if (kind == TraceKind::kTaskWait && gemm) {
      task->sum_us[2] += us;
    } else if (kind == TraceKind::kDispatchCopy) {
      widen(dispatch, e);
      ++dispatch.tasks;
      dispatch.sum_us[0] += us;
    } else if (kind == TraceKind::kCombineWait) {
      widen(combine_wait, e);
    } else if (kind == TraceKind::kCombine) {
      widen(combine, e);
    }
  }
  auto ms = [&](uint64_t t) { return static_cast<double>(t - start) * 1e-6; };
  std::printf("    where the time goes (one traced pass, bf16 weight gradients; ms from its first event):\n");
  std::printf("      %-20s %7s %12s %12s %12s %9s %9s\n", "kind", "tasks", "mainloop us", "epilogue us",
              "waits ms", "first ms", "last ms");
  for (size_t k = 0; k < kinds.size(); ++k) {
    const Span& s = kinds[k];
    if (s.tasks == 0) continue;
    std::printf("      %-20s %7d %12.1f %12.1f %12.2f %9.3f %9.3f\n", kind_names[k], s.tasks, s.sum_us[0] / s.tasks,
                s.sum_us[1] / s.tasks, s.sum_us[2] * 1e-3, ms(s.first), ms(s.last));
  }
  if (dispatch.tasks > 0) {
    std::printf("      %-20s %7d %12.1f %12s %12s %9.3f %9.3f\n", "dispatch (m-tiles)", dispatch.tasks,
                dispatch.sum_us[0] / dispatch.tasks, "-", "-", ms(dispatch.first), ms(dispatch.last));
  }
  if (combine.last > 0) {
    std::printf("      %-20s %7s %12s %12s %12s %9.3f %9.3f\n", "combine", "-", "-", "-", "-", ms(combine.first),
                ms(combine.last));
  }
}

}  // namespace

bool run_backward(const LayerConfig& config, const FusedForwardOptions& options, const synthetic::Layer& layer,
                  const DeviceLayer& device, int iterations, uint64_t seed, int threads,
                  const std::string& trace_file) {
  const int R = config.world_size;
  const size_t H = static_cast<size_t>(config.hidden), I = static_cast<size_t>(config.intermediate),
               S = static_cast<size_t>(config.shared_width()), k = static_cast<size_t>(config.top_k),
               El = static_cast<size_t>(config.experts_per_rank());
  // 1. The training forward, once: each rank keeps its schedule and gate/up.
  FusedForward forward(config, options);
  std::vector<RankTensors> fwd = device.tensors();
  std::vector<Buffer> kept;
  for (int r = 0; r < R; ++r) {
    const size_t T = static_cast<size_t>(config.tokens_per_rank[static_cast<size_t>(r)]);
    kept.emplace_back(forward.pass_state_bytes());
    kept.emplace_back(static_cast<size_t>(forward.saved_rows()) * 2 * I * 2);
    kept.emplace_back(T * 2 * S * 2);
    fwd[static_cast<size_t>(r)].pass_state = kept[kept.size() - 3].ptr;
    fwd[static_cast<size_t>(r)].preact = kept[kept.size() - 2].ptr;
    fwd[static_cast<size_t>(r)].shared_preact = kept[kept.size() - 1].ptr;
  }
  forward.run(fwd);
  forward.check();

  // 2. dout, and every output.
  std::vector<std::vector<float>> dout_host;
  std::vector<Buffer> bufs;
  std::vector<BackwardRankTensors> bwd(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    const size_t T = static_cast<size_t>(config.tokens_per_rank[static_cast<size_t>(r)]);
    dout_host.push_back(random_dout(T * H, seed + 1000 + static_cast<uint64_t>(r)));
    std::vector<uint16_t> bits(T * H);
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = float_to_bf16_bits(dout_host.back()[i]);
    Buffer dout(T * H * 2);
    if (T > 0) MOK_CUDA_CHECK(cudaMemcpy(dout.ptr, bits.data(), dout.bytes, cudaMemcpyHostToDevice));
    BackwardRankTensors& t = bwd[static_cast<size_t>(r)];
    const RankTensors& f = fwd[static_cast<size_t>(r)];
    t.x = f.x;
    t.weights = f.weights;
    t.w13 = f.w13;
    t.w2 = f.w2;
    t.shared_w13 = f.shared_w13;
    t.shared_w2 = f.shared_w2;
    t.pass_state = f.pass_state;
    t.preact = f.preact;
    t.shared_preact = f.shared_preact;
    t.dout = dout.ptr;
    bufs.push_back(std::move(dout));
    bufs.emplace_back(T * H * 2);
    t.dx = bufs.back().ptr;
    bufs.emplace_back(T * k * 4);
    t.dweights = bufs.back().as<float>();
    bufs.emplace_back(El * 2 * I * H * 4);
    t.dw13 = bufs.back().as<float>();
    bufs.emplace_back(El * H * I * 4);
    t.dw2 = bufs.back().as<float>();
    bufs.emplace_back(2 * S * H * 4);
    t.dshared_w13 = bufs.back().as<float>();
    bufs.emplace_back(H * S * 4);
    t.dshared_w2 = bufs.back().as<float>();
  }

  // 3. Timing: passes alone (median), then back to back (mean).
  FusedBackward backward(config, options);
  const double flops = 2.0 * config.forward_flops();  // useful: twice the forward's
  std::printf("[b] fused backward (save mode), workspace %.2f GB; %s\n", static_cast<double>(backward.workspace_bytes()) / 1e9,
              backward.options().describe().c_str());
  cudaEvent_t start, stop;
  MOK_CUDA_CHECK(cudaEventCreate(&start));
  MOK_CUDA_CHECK(cudaEventCreate(&stop));
  struct Timing {
    double median_ms, b2b_ms;
  };
  // 3 warm-up passes, `iterations` passes alone (median), as many back to back (mean).
  auto time_mode = [&](FusedBackward& object, std::span<const BackwardRankTensors> ranks, WeightGradOutput mode) {
    for (int i = 0; i < 3; ++i) object.run(ranks, nullptr, mode);
    object.check();
    std::vector<double> ms;
    for (int i = 0; i < iterations; ++i) {
      MOK_CUDA_CHECK(cudaEventRecord(start));
      object.run(ranks, nullptr, mode);
      MOK_CUDA_CHECK(cudaEventRecord(stop));
      MOK_CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      MOK_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(t);
    }
    MOK_CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < iterations; ++i) object.run(ranks, nullptr, mode);
    MOK_CUDA_CHECK(cudaEventRecord(stop));
    MOK_CUDA_CHECK(cudaEventSynchronize(stop));
    float total = 0;
    MOK_CUDA_CHECK(cudaEventElapsedTime(&total, start, stop));
    object.check();
    std::sort(ms.begin(), ms.end());
    return Timing{ms[ms.size() / 2], static_cast<double>(total) / iterations};
  };
  // "    fused backward, <what> weight gradients: ..." and `tail` before the newline.
  auto print_timing = [&](const char* what, const Timing& t, const std::string& tail) {
    std::printf("    fused backward, %s weight gradients: %.3f ms (median of %d), %.1f useful TFLOP/s; back to back "
                "%.3f ms per pass, %.1f TFLOP/s%s\n",
                what, t.median_ms, iterations, flops / t.median_ms * 1e-9, t.b2b_ms, flops / t.b2b_ms * 1e-9,
                tail.c_str());
  };
  const Timing save_bf16 = time_mode(backward, bwd, WeightGradOutput::kBf16);
  print_timing("bf16", save_bf16, "");
  // About a second of passes back to back, by NVML (the pass runs at the power cap: docs/perf-notes.md).
  report_energy("    ", save_bf16.b2b_ms, flops, [&] { backward.run(bwd, nullptr, WeightGradOutput::kBf16); });
  backward.check();
  {  // bf16 weight gradients, as the autograd asks for bf16 weights
    FusedForwardOptions traced_options = options;
    traced_options.trace_events = 1 << 22;
    FusedBackward traced(config, traced_options);
    traced.run(bwd, nullptr, WeightGradOutput::kBf16);
    const std::vector<TraceEvent> events = traced.trace();
    print_trace_summary(events, kind_names(traced.mode()));
    if (!trace_file.empty()) {
      write_trace_csv(events, trace_file);
      std::printf("    events written to %s\n", trace_file.c_str());
    }
  }

  // Recompute mode on the same forward pass: the schedule only (the save
  // mode's pre-activations are there, but not given), into the same outputs.
  // Before the save mode's fp32 passes, so that the bits hashed below are the
  // save mode's; the recompute mode's fp32 bits are hashed on their own.
  uint64_t recompute_hash = 0;
  {
    std::vector<BackwardRankTensors> bwd_recompute = bwd;
    for (BackwardRankTensors& t : bwd_recompute) t.preact = t.shared_preact = nullptr;
    FusedBackward recompute(config, options, BackwardMode::kRecompute);
    std::printf("[b] fused backward (recompute mode), workspace %.2f GB\n",
                static_cast<double>(recompute.workspace_bytes()) / 1e9);
    const Timing t = time_mode(recompute, bwd_recompute, WeightGradOutput::kBf16);
    char ratio[64];
    std::snprintf(ratio, sizeof ratio, "; %.3f x save mode", t.median_ms / save_bf16.median_ms);
    print_timing("recompute mode, bf16", t, ratio);
    // One fp32 pass into outputs of NaN (0xFF bytes): an element it leaves
    // unwritten changes the hash.
    for (int r = 0; r < R; ++r) {
      for (size_t j = 1; j < 7; ++j) {
        const Buffer& b = bufs[static_cast<size_t>(r) * 7 + j];
        if (b.bytes > 0) MOK_CUDA_CHECK(cudaMemset(b.ptr, 0xFF, b.bytes));
      }
    }
    recompute.run(bwd_recompute, nullptr, WeightGradOutput::kFp32);
    recompute.check();
    recompute_hash = hash_gradients(bufs, R);
  }
  {  // What the forward keeps per layer for each mode, every rank's.
    size_t saved_bytes = 0, state_bytes = 0;
    for (int r = 0; r < R; ++r) {
      const size_t T = static_cast<size_t>(config.tokens_per_rank[static_cast<size_t>(r)]);
      state_bytes += forward.pass_state_bytes();
      saved_bytes += static_cast<size_t>(forward.saved_rows()) * 2 * I * 2 + T * 2 * S * 2;
    }
    std::printf("    kept per layer by the forward (every rank's): save mode %.3f GB (pre-activations %.3f GB + "
                "pass state %.3f GB), recompute mode %.3f GB (pass state)\n",
                static_cast<double>(saved_bytes + state_bytes) / 1e9, static_cast<double>(saved_bytes) / 1e9,
                static_cast<double>(state_bytes) / 1e9, static_cast<double>(state_bytes) / 1e9);
  }

  print_timing("fp32", time_mode(backward, bwd, WeightGradOutput::kFp32), "");  // last: the bits below are these
  MOK_CUDA_CHECK(cudaEventDestroy(start));
  MOK_CUDA_CHECK(cudaEventDestroy(stop));

  // 4. The gradients' bits, and the reference where affordable.
  const uint64_t h = hash_gradients(bufs, R);
  std::printf("    gradient bits: fnv1a64 %016llx\n", static_cast<unsigned long long>(h));
  std::printf("    recompute bits: %s (fnv1a64 %016llx)\n", recompute_hash == h ? "same as save mode" : "DIFFER",
              static_cast<unsigned long long>(recompute_hash));
  if (recompute_hash != h) {
    std::printf("    FAILED: recompute mode's gradients differ from save mode's\n");
    return false;
  }
  if (flops > 4e10) {
    std::printf("    reference check skipped: %.0f GFLOP is too much for the CPU reference\n", flops * 1e-9);
    return true;
  }
  std::vector<uint16_t> dx;
  std::vector<float> dweights, dw13, dw2, dsw13(2 * S * H, 0.0f), dsw2(H * S, 0.0f);
  for (int r = 0; r < R; ++r) {
    const size_t b = static_cast<size_t>(r) * 7;  // dout, dx, dweights, dw13, dw2, dshared_w13, dshared_w2
    const auto rdx = bufs[b + 1].download<uint16_t>();
    const auto rdw = bufs[b + 2].download<float>();
    const auto r13 = bufs[b + 3].download<float>();
    const auto r2 = bufs[b + 4].download<float>();
    const auto rs13 = bufs[b + 5].download<float>();
    const auto rs2 = bufs[b + 6].download<float>();
    dx.insert(dx.end(), rdx.begin(), rdx.end());
    dweights.insert(dweights.end(), rdw.begin(), rdw.end());
    dw13.insert(dw13.end(), r13.begin(), r13.end());
    dw2.insert(dw2.end(), r2.begin(), r2.end());
    for (size_t i = 0; i < rs13.size(); ++i) dsw13[i] += rs13[i];  // the ranks' shares, in rank order
    for (size_t i = 0; i < rs2.size(); ++i) dsw2[i] += rs2[i];
  }
  const WorldSchedule schedule = build_schedule(config, layer.routing(), {ScheduleOptions{}.tile_rows, threads});
  std::vector<const float*> dout_ptrs;
  for (const auto& d : dout_host) dout_ptrs.push_back(d.data());
  ReferenceOptions ref_options;
  ref_options.num_threads = threads;
  const ReferenceBackward ref = reference_backward(layer.inputs(), schedule, dout_ptrs, ref_options);
  std::vector<double> flat_dw;
  for (const auto& v : ref.dweights) flat_dw.insert(flat_dw.end(), v.begin(), v.end());
  const double errors[] = {relative_l2_error(dx, ref.dx), relative_error(dweights, flat_dw),
                           relative_error(dw13, ref.dw13), relative_error(dw2, ref.dw2),
                           S > 0 ? relative_error(dsw13, ref.dshared_w13) : 0.0,
                           S > 0 ? relative_error(dsw2, ref.dshared_w2) : 0.0};
  const double worst = *std::max_element(std::begin(errors), std::end(errors));
  std::printf("    vs CPU reference, relative L2 (dx, dweights, dW13, dW2, shared dW13, shared dW2): "
              "%.1e %.1e %.1e %.1e %.1e %.1e (%s)\n",
              errors[0], errors[1], errors[2], errors[3], errors[4], errors[5], worst < 2e-2 ? "ok" : "TOO LARGE");
  return worst < 2e-2;
}

}  // namespace mok::tools
