// The peer world: one process, one GPU per rank, peer access between them,
// one launch per GPU ordered by events. On one GPU it runs as a world of one
// rank (the single-GPU fallback of the multi-GPU path: system-scope counters,
// per-GPU launch, event ordering); with 2+ GPUs, as worlds of 2, 4 and 8
// ranks. Either way its output must be bitwise identical to the virtual world
// on the same global batch, and close to the CPU reference.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu_test_env.hpp"
#include "reference_check.hpp"
#include "mok/bf16.hpp"
#include "mok/device_layer.hpp"
#include "mok/error.hpp"
#include "mok/fused_forward.hpp"
#include "mok/presets.hpp"
#include "mok/reference.hpp"
#include "mok/schedule.hpp"
#include "mok/synthetic.hpp"

namespace {

constexpr int kGlobalTokens = 256;

std::vector<uint16_t> run_world(const mok::LayerConfig& config, const std::vector<int>& devices, uint64_t seed) {
  const auto layer = mok::synthetic::make_layer(config, seed);
  mok::DeviceLayer device(layer, devices);
  mok::FusedForwardOptions options;
  options.minibatch_rows = 256;
  options.ring_slots = 2;
  options.devices = devices;
  mok::FusedForward forward(config, options);
  for (int pass = 0; pass < 3; ++pass) {  // later passes reuse every buffer and event
    device.poison_outputs();
    forward.run(device.tensors());
    forward.check();
  }
  return device.download_outputs();
}

double relative_error_to_reference(const std::vector<uint16_t>& out, const mok::LayerConfig& config, uint64_t seed) {
  return mok::test_support::relative_error_to_reference(out, mok::synthetic::make_layer(config, seed));
}

mok::LayerConfig config_for(int world) {
  return mok::make_config(mok::find_shape("medium"), world, kGlobalTokens / world);
}

TEST(PeerWorld, OneGpuWorldMatchesTheVirtualWorldBitwise) {
  MOK_REQUIRE_HOPPER();
  const auto peer = run_world(config_for(1), {0}, 31);
  EXPECT_EQ(peer, run_world(config_for(1), {}, 31));
  EXPECT_EQ(peer, run_world(config_for(4), {}, 31));  // the same global batch over 4 virtual ranks
  EXPECT_LT(relative_error_to_reference(peer, config_for(1), 31), 1e-2);
}

TEST(PeerWorld, EveryVisibleGpuCountMatchesTheVirtualWorldBitwise) {
  MOK_REQUIRE_HOPPER();
  const int gpus = mok::detail::hopper_device_count();
  if (gpus < 2) GTEST_SKIP() << "needs 2 or more Hopper GPUs (found " << gpus << ")";
  const auto virtual_out = run_world(config_for(1), {}, 37);
  for (int world : {2, 4, 8}) {
    if (world > gpus) break;
    std::vector<int> devices(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) devices[r] = r;
    SCOPED_TRACE(testing::Message() << "peer world of " << world << " GPUs");
    const auto peer = run_world(config_for(world), devices, 37);
    EXPECT_EQ(peer, virtual_out);
    EXPECT_EQ(peer, run_world(config_for(world), {}, 37));
    EXPECT_LT(relative_error_to_reference(peer, config_for(world), 37), 1e-2);
  }
}

TEST(PeerWorld, RejectsABadDeviceList) {
  MOK_REQUIRE_HOPPER();
  mok::FusedForwardOptions options;
  options.devices = {0};
  EXPECT_THROW(mok::FusedForward(config_for(2), options), mok::Error);  // 1 GPU for 2 ranks
  options.devices = {0, 0};
  EXPECT_THROW(mok::FusedForward(config_for(2), options), mok::Error);  // one rank per GPU
  options.devices = {0, 99};
  EXPECT_THROW(mok::FusedForward(config_for(2), options), mok::Error);  // no such GPU
}

}  // namespace
