// The SwiGLU's sigmoid (device/gemm/tile_epilogue.cuh), ex2.approx.ftz and
// rcp.approx.ftz by hand, against the libdevice form it replaced,
// __fdividef(1, 1 + __expf(-gate)), and silu = gate * sigmoid(gate) against
// __fdividef(gate, 1 + __expf(-gate)): the same bits for every one of the
// 2^32 fp32 gates (NaN against NaN counts as equal), so the forward's h and
// the backward's gradients did not change with it. The libdevice form is
// compiled here with the kernels' own flags (no fast-math, no ftz). Then the
// sigmoid against the host's 1 / (1 + exp(-g)) on a sweep of gates, within
// the few ulp that two approximate MUFU operations allow (more near fp32's
// smallest normal, where the reciprocal loses accuracy).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/cuda_check.hpp"
#include "device/gemm/tile_epilogue.cuh"
#include "gpu/gemm_test_support.hpp"
#include "gpu/gpu_test_env.hpp"

namespace {

using mok::gemm_test::DeviceBuffer;

struct Mismatches {
  unsigned long long sigmoid, silu;
  unsigned int first_sigmoid, first_silu;  // the smallest gate bit pattern that differs
};

__device__ bool same_bits(float a, float b) {
  return __float_as_uint(a) == __float_as_uint(b) || (isnan(a) && isnan(b));
}

__global__ void compare_every_gate(Mismatches* out) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long sigmoid_bad = 0, silu_bad = 0;
  for (uint64_t u = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < (1ull << 32); u += stride) {
    const float g = __uint_as_float(static_cast<unsigned int>(u));
    const float e = __expf(-g);
    const float d = __fadd_rn(1.0f, e);
    const float s = mok::device::sigmoid(g);
    if (!same_bits(s, __fdividef(1.0f, d))) {
      ++sigmoid_bad;
      atomicMin(&out->first_sigmoid, static_cast<unsigned int>(u));
    }
    if (!same_bits(__fmul_rn(g, s), __fdividef(g, d))) {
      ++silu_bad;
      atomicMin(&out->first_silu, static_cast<unsigned int>(u));
    }
  }
  if (sigmoid_bad) atomicAdd(&out->sigmoid, sigmoid_bad);
  if (silu_bad) atomicAdd(&out->silu, silu_bad);
}

__global__ void sigmoid_of(const float* g, float* s, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) s[i] = mok::device::sigmoid(g[i]);
}

TEST(SwigluMath, SigmoidAndSiluKeepTheLibdeviceBitsForEveryGate) {
  MOK_REQUIRE_HOPPER();
  Mismatches init{0, 0, 0xffffffffu, 0xffffffffu};
  DeviceBuffer<Mismatches> d_out(1);
  MOK_CUDA_CHECK(cudaMemcpy(d_out.get(), &init, sizeof(init), cudaMemcpyHostToDevice));
  compare_every_gate<<<132 * 8, 256>>>(d_out.get());
  MOK_CUDA_CHECK(cudaGetLastError());
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  Mismatches got{};
  MOK_CUDA_CHECK(cudaMemcpy(&got, d_out.get(), sizeof(got), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got.sigmoid, 0u) << "first differing gate bits 0x" << std::hex << got.first_sigmoid;
  EXPECT_EQ(got.silu, 0u) << "first differing gate bits 0x" << std::hex << got.first_silu;
}

TEST(SwigluMath, SigmoidIsTheLogisticFunctionWithinAFewUlp) {
  MOK_REQUIRE_HOPPER();
  std::vector<float> g;
  for (float x = -100.0f; x <= 100.0f; x += 0.0137f) g.push_back(x);
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 87.0f, 89.0f, -87.0f, -89.0f, INFINITY, -INFINITY}) g.push_back(x);
  const int n = static_cast<int>(g.size());
  DeviceBuffer<float> d_g(g), d_s(static_cast<size_t>(n));
  MOK_CUDA_CHECK(cudaMemset(d_s.get(), 0xFF, sizeof(float) * n));  // NaN poison
  sigmoid_of<<<(n + 255) / 256, 256>>>(d_g.get(), d_s.get(), n);
  MOK_CUDA_CHECK(cudaGetLastError());
  std::vector<float> s(static_cast<size_t>(n));
  MOK_CUDA_CHECK(cudaMemcpy(s.data(), d_s.get(), sizeof(float) * n, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    const double want = 1.0 / (1.0 + std::exp(-static_cast<double>(g[i])));
    // gate * log2(e) is rounded to fp32 (at most |gate| 2^-24 of e^-gate,
    // relative, and at most that of the sigmoid), then two approximate MUFU
    // operations and two roundings (a few ulp, more near fp32's smallest
    // normal: ~11 ulp measured at gate -87.26); below 2^-126 the reciprocal
    // flushes to zero (gate < -87.3). Twice that, as a bound.
    const double tol = want < 0x1p-126 ? 0x1p-126 : want * (std::fabs(g[i]) + 16.0) * 0x1p-23;
    if (!(std::fabs(s[i] - want) <= tol) && bad++ < 5) {
      ADD_FAILURE() << "sigmoid(" << g[i] << ") = " << s[i] << ", want " << want;
    }
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
