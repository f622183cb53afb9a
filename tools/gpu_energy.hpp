// Energy and SM clock of one GPU over a stretch of work, read from NVML
// (the driver's libnvidia-ml, opened at run time: nothing to link, and where
// it is missing the meter says so instead of failing). An H200 holds its
// power cap by lowering its clocks, so a kernel that moves more bytes per
// FLOP runs at a lower clock: energy per useful FLOP and the mean clock say
// why two equally efficient-looking kernels differ in time
// (docs/perf-notes.md, "The power cap").
#pragma once

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>

#include "common/cuda_check.hpp"

namespace mok::tools {

class EnergyMeter {
 public:
  struct Reading {
    double joules = 0;          // energy the GPU drew over the stretch
    double seconds = 0;         // its wall time
    double mean_sm_mhz = 0;     // SM clock, sampled every 5 ms
  };

  // The meter of CUDA device `device`; available() is false without NVML.
  explicit EnergyMeter(int device) {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) return;
    init_ = reinterpret_cast<InitFn>(dlsym(lib_, "nvmlInit_v2"));
    shutdown_ = reinterpret_cast<InitFn>(dlsym(lib_, "nvmlShutdown"));
    by_bus_ = reinterpret_cast<ByBusFn>(dlsym(lib_, "nvmlDeviceGetHandleByPciBusId_v2"));
    energy_ = reinterpret_cast<EnergyFn>(dlsym(lib_, "nvmlDeviceGetTotalEnergyConsumption"));
    clock_ = reinterpret_cast<ClockFn>(dlsym(lib_, "nvmlDeviceGetClockInfo"));
    char bus[32] = {};
    if (init_ == nullptr || shutdown_ == nullptr || by_bus_ == nullptr || energy_ == nullptr || clock_ == nullptr ||
        init_() != 0) {
      return;
    }
    initialised_ = true;
    unsigned long long probe = 0;
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), device) == cudaSuccess && by_bus_(bus, &handle_) == 0 &&
        energy_(handle_, &probe) == 0) {
      available_ = true;
    }
  }
  ~EnergyMeter() {
    if (initialised_) shutdown_();
    if (lib_ != nullptr) dlclose(lib_);
  }
  EnergyMeter(const EnergyMeter&) = delete;
  EnergyMeter& operator=(const EnergyMeter&) = delete;

  bool available() const { return available_; }

  // Runs `work` (which must finish its GPU work before returning) and
  // measures it. The energy counter ticks in millijoules and is refreshed
  // by the driver every few ms: give it a stretch of a second or so.
  template <class Work>
  Reading measure(Work&& work) {
    Reading r;
    if (!available_) {
      work();
      return r;
    }
    std::atomic<bool> done{false};
    double clock_sum = 0;
    int samples = 0;
    std::thread sampler([&] {
      while (!done.load()) {
        unsigned int mhz = 0;
        if (clock_(handle_, kClockSm, &mhz) == 0) {
          clock_sum += mhz;
          ++samples;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
    unsigned long long before = 0, after = 0;
    energy_(handle_, &before);
    const auto start = std::chrono::steady_clock::now();
    work();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    energy_(handle_, &after);
    done.store(true);
    sampler.join();
    r.joules = static_cast<double>(after - before) * 1e-3;
    r.mean_sm_mhz = samples > 0 ? clock_sum / samples : 0;
    return r;
  }

 private:
  using Device = void*;  // nvmlDevice_t
  using InitFn = int (*)();
  using ByBusFn = int (*)(const char*, Device*);
  using EnergyFn = int (*)(Device, unsigned long long*);
  using ClockFn = int (*)(Device, int, unsigned int*);
  static constexpr int kClockSm = 1;  // NVML_CLOCK_SM

  void* lib_ = nullptr;
  InitFn init_ = nullptr, shutdown_ = nullptr;
  ByBusFn by_bus_ = nullptr;
  EnergyFn energy_ = nullptr;
  ClockFn clock_ = nullptr;
  Device handle_ = nullptr;
  bool initialised_ = false, available_ = false;
};

// About a second of passes back to back (run_pass() enqueues one; `pass_ms`
// is a pass's time, `flops` its useful FLOPs), measured by NVML on the
// current device and printed as "<indent>energy over N passes ...": energy
// per pass and per useful FLOP, mean power and SM clock.
template <class RunPass>
void report_energy(const char* indent, double pass_ms, double flops, RunPass&& run_pass) {
  int cuda_device = 0;
  MOK_CUDA_CHECK(cudaGetDevice(&cuda_device));
  EnergyMeter meter(cuda_device);
  if (!meter.available()) {
    std::printf("%senergy: not measured (NVML not available)\n", indent);
    return;
  }
  const int passes = std::max(10, static_cast<int>(1000.0 / std::max(pass_ms, 0.01)));
  const auto r = meter.measure([&] {
    for (int i = 0; i < passes; ++i) run_pass();
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
  });
  const double joules = r.joules / passes;
  std::printf("%senergy over %d passes back to back (NVML): %.3f J per pass, %.2f pJ per useful FLOP, %.0f W, "
              "mean SM clock %.0f MHz\n",
              indent, passes, joules, joules / flops * 1e12, r.joules / r.seconds, r.mean_sm_mhz);
}

}  // namespace mok::tools
