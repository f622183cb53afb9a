// Device-ordered passes (FusedForwardOptions::device_ordered, and the process
// world, which always uses them): the kernel's start/end world barrier and
// the two counter sets it zeroes itself replace the host's memset. Many
// passes in a row with no host zeroing must give the same bits as the
// host-ordered mode (and stay close to the CPU reference), whatever the world
// size, with inputs changing between passes, after a failed pass, and in a
// process world of one rank. Multi-process worlds are tested from Python
// (python/tests/test_process_world.py) and tools/torchrun_forward.py.
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

using mok::synthetic::RoutingMode;

constexpr int kGlobalTokens = 256;

mok::FusedForwardOptions ring_options(bool device_ordered) {
  mok::FusedForwardOptions o;
  o.minibatch_rows = 256;
  o.ring_slots = 2;
  o.device_ordered = device_ordered;
  return o;
}

std::vector<uint16_t> one_pass(mok::FusedForward& forward, mok::DeviceLayer& device) {
  device.poison_outputs();
  forward.run(device.tensors());
  forward.check();
  return device.download_outputs();
}

using mok::test_support::relative_error_to_reference;

TEST(DeviceOrdered, TwentyPassesWithoutMemsetMatchTheHostOrderedModeBitwise) {
  MOK_REQUIRE_HOPPER();
  std::vector<uint16_t> world_one;
  for (int world : {1, 2, 4, 8}) {
    SCOPED_TRACE(testing::Message() << "virtual world of " << world << " ranks");
    const auto config = mok::make_config(mok::find_shape("medium"), world, kGlobalTokens / world);
    const auto layer = mok::synthetic::make_layer(config, 41);
    mok::DeviceLayer device(layer);
    mok::FusedForward host_ordered(config, ring_options(false));
    const auto baseline = one_pass(host_ordered, device);
    if (world_one.empty()) {
      world_one = baseline;
      EXPECT_LT(relative_error_to_reference(baseline, layer), 1e-2);
    }
    EXPECT_EQ(baseline, world_one);  // the same global batch at every world size

    mok::FusedForward forward(config, ring_options(true));
    for (int pass = 0; pass < 20; ++pass) {
      ASSERT_EQ(one_pass(forward, device), baseline) << "pass " << pass << " (checked after each)";
    }
    // Back to back: no host synchronisation between passes at all.
    device.poison_outputs();
    for (int pass = 0; pass < 20; ++pass) forward.run(device.tensors());
    forward.check();
    EXPECT_EQ(device.download_outputs(), baseline) << "after 20 passes without a host sync";
  }
}

TEST(DeviceOrdered, InputsAndSchedulesChangingEveryPassLeaveNothingStale) {
  MOK_REQUIRE_HOPPER();
  // Alternating routings give each pass a different schedule (counter
  // targets, padded rows); a counter the GPU failed to zero, or a peer still
  // reading the previous pass, shows up as a wrong bit.
  const auto config = mok::make_config(mok::find_shape("small"), std::vector<int>{70, 0, 130, 33});
  const auto skewed = mok::synthetic::make_layer(config, 6, RoutingMode::kSkewed);
  const auto same = mok::synthetic::make_layer(config, 7, RoutingMode::kSameExperts);
  const auto uniform = mok::synthetic::make_layer(config, 8, RoutingMode::kUniform);
  std::vector<std::unique_ptr<mok::DeviceLayer>> devices;
  std::vector<std::vector<uint16_t>> baselines;
  mok::FusedForward host_ordered(config, ring_options(false));
  for (const auto* layer : {&skewed, &same, &uniform}) {
    devices.push_back(std::make_unique<mok::DeviceLayer>(*layer));
    baselines.push_back(one_pass(host_ordered, *devices.back()));
  }
  mok::FusedForward forward(config, ring_options(true));
  for (int pass = 0; pass < 21; ++pass) {
    const int which = (pass * 7) % 3;  // 0, 1, 2, 0, ... and every pair of neighbours
    ASSERT_EQ(one_pass(forward, *devices[which]), baselines[which]) << "pass " << pass << " layer " << which;
  }
}

TEST(DeviceOrdered, AFailedPassIsReportedAndTheNextPassesAreClean) {
  MOK_REQUIRE_HOPPER();
  const auto config = mok::make_config(mok::find_shape("small"), 2, 16);
  auto bad_layer = mok::synthetic::make_layer(config, 2);
  bad_layer.expert_ids[1][3 * config.top_k + 1] = 99;
  mok::DeviceLayer bad(bad_layer);
  const auto good_layer = mok::synthetic::make_layer(config, 2);
  mok::DeviceLayer good(good_layer);
  mok::FusedForward host_ordered(config, ring_options(false));
  const auto baseline = one_pass(host_ordered, good);

  mok::FusedForward forward(config, ring_options(true));
  // Failures in passes of both parities (both counter sets hold a report once).
  for (int pass = 0; pass < 8; ++pass) {
    SCOPED_TRACE(testing::Message() << "pass " << pass);
    if (pass == 1 || pass == 4 || pass == 5) {
      forward.run(bad.tensors());
      try {
        forward.check();
        ADD_FAILURE() << "no error for a bad expert id";
      } catch (const mok::Error& e) {
        EXPECT_NE(std::string(e.what()).find("rank 1, token 3, slot 1: expert id 99"), std::string::npos) << e.what();
      }
    } else {
      ASSERT_EQ(one_pass(forward, good), baseline);
    }
  }
}

TEST(PeerWorld, DeviceOrderedMatchesTheVirtualWorldOnEveryGpuCount) {
  MOK_REQUIRE_HOPPER();
  const int gpus = mok::detail::hopper_device_count();
  const auto virtual_config = mok::make_config(mok::find_shape("medium"), 1, kGlobalTokens);
  const auto virtual_layer = mok::synthetic::make_layer(virtual_config, 43);
  mok::DeviceLayer virtual_device(virtual_layer);
  mok::FusedForward virtual_forward(virtual_config, ring_options(false));
  const auto baseline = one_pass(virtual_forward, virtual_device);
  for (int world : {1, 2, 4, 8}) {
    if (world > gpus) break;
    SCOPED_TRACE(testing::Message() << "device-ordered peer world of " << world << " GPUs");
    std::vector<int> devices(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) devices[r] = r;
    const auto config = mok::make_config(mok::find_shape("medium"), world, kGlobalTokens / world);
    const auto layer = mok::synthetic::make_layer(config, 43);
    mok::DeviceLayer device(layer, devices);
    auto options = ring_options(true);
    options.devices = devices;
    mok::FusedForward forward(config, options);
    for (int pass = 0; pass < 5; ++pass) ASSERT_EQ(one_pass(forward, device), baseline) << "pass " << pass;
    device.poison_outputs();
    for (int pass = 0; pass < 10; ++pass) forward.run(device.tensors());  // the GPUs order themselves
    forward.check();
    EXPECT_EQ(device.download_outputs(), baseline);
  }
}

TEST(ProcessWorld, OneRankNeedsNoIpcAndMatchesTheVirtualWorldBitwise) {
  MOK_REQUIRE_HOPPER();
  const auto config = mok::make_config(mok::find_shape("medium"), 1, kGlobalTokens);
  const auto layer = mok::synthetic::make_layer(config, 47);
  mok::DeviceLayer device(layer);
  mok::FusedForward virtual_forward(config, ring_options(false));
  const auto baseline = one_pass(virtual_forward, device);
  // The same global batch over a virtual world of 4 ranks.
  const auto config4 = mok::make_config(mok::find_shape("medium"), 4, kGlobalTokens / 4);
  const auto layer4 = mok::synthetic::make_layer(config4, 47);
  mok::DeviceLayer device4(layer4);
  mok::FusedForward virtual4(config4, ring_options(false));
  EXPECT_EQ(one_pass(virtual4, device4), baseline);

  auto options = ring_options(false);
  options.process_rank = 0;
  mok::FusedForward forward(config, options);
  EXPECT_TRUE(forward.options().device_ordered);
  cudaStream_t stream;
  MOK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int pass = 0; pass < 20; ++pass) {
    device.poison_outputs();
    forward.run(device.tensors()[0], stream);
    forward.check(stream);
    ASSERT_EQ(device.download_outputs(), baseline) << "pass " << pass;
  }
  MOK_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(ProcessWorld, MisuseIsAClearError) {
  MOK_REQUIRE_HOPPER();
  auto expect_error = [](auto&& call, const std::string& says) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one saying: " << says;
    } catch (const mok::Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  const auto config = mok::make_config(mok::find_shape("small"), 2, 64);
  auto options = ring_options(false);
  options.process_rank = 2;
  expect_error([&] { mok::FusedForward f(config, options); }, "process_rank = 2");
  options.process_rank = 0;
  options.devices = {0};
  expect_error([&] { mok::FusedForward f(config, options); }, "must be empty in a process world");
  options.devices = {};

  const auto layer = mok::synthetic::make_layer(config, 1);
  mok::DeviceLayer device(layer);
  mok::FusedForward rank0(config, options);
  expect_error([&] { rank0.run(device.tensors()[0]); }, "import_peers() with every rank's handle first");
  expect_error([&] { rank0.run(device.tensors()); }, "runs only this rank's tensors");
  const std::vector<uint8_t> mine = rank0.export_handle();
  expect_error([&] { rank0.import_peers(std::vector<std::vector<uint8_t>>{mine}); }, "got 1 handles; world_size is 2");
  expect_error([&] { rank0.import_peers(std::vector<std::vector<uint8_t>>{mine, {1, 2, 3}}); }, "has 3 bytes");
  expect_error([&] { rank0.import_peers(std::vector<std::vector<uint8_t>>{mine, mine}); },
               "handles[1] is rank 0's handle");
  auto other_config = mok::make_config(mok::find_shape("small"), 2, 80);  // other token counts
  auto rank1_options = options;
  rank1_options.process_rank = 1;
  mok::FusedForward other(other_config, rank1_options);
  expect_error([&] { rank0.import_peers(std::vector<std::vector<uint8_t>>{mine, other.export_handle()}); },
               "another layer config or options");
  mok::FusedForward same_gpu(config, rank1_options);
  expect_error([&] { rank0.import_peers(std::vector<std::vector<uint8_t>>{mine, same_gpu.export_handle()}); },
               "runs on this process's GPU too");
  const auto world_of_one = mok::make_config(mok::find_shape("small"), 1, 64);
  auto one_options = options;
  one_options.process_rank = 0;
  mok::FusedForward alone(world_of_one, one_options);
  expect_error([&] { rank0.import_peers(std::vector<std::vector<uint8_t>>{alone.export_handle(), mine}); },
               "from a world of 1 ranks");

  mok::FusedForward virtual_world(config, ring_options(true));
  expect_error([&] { virtual_world.run(device.tensors()[0]); }, "only a process world");
  expect_error([&] { (void)virtual_world.export_handle(); }, "only a process world");
}

}  // namespace
