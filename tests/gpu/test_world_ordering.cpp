// The host side's ordering of passes and its housekeeping (review of
// 2026-12-01, section 5): a pass never touches a workspace the previous pass
// still reads, whatever streams the caller uses; check() waits for the last
// pass wherever it ran; destroying a world leaves the caller's GPU current;
// check() after close_peers() is well defined. A spinning kernel holds a
// stream so that a missing wait shows as a wrong bit or a missed error
// rather than as a rare race.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "gpu_test_env.hpp"
#include "mok/device_layer.hpp"
#include "mok/error.hpp"
#include "mok/fused_forward.hpp"
#include "mok/presets.hpp"
#include "mok/synthetic.hpp"
#include "stream_hold.hpp"

namespace {

using mok::test_support::hold_stream;

constexpr int kHoldMs = 300;

mok::FusedForwardOptions small_ring() {
  mok::FusedForwardOptions o;
  o.minibatch_rows = 128;
  o.ring_slots = 2;
  return o;
}

class Stream {
 public:
  Stream() { MOK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// What `enqueue` launches on `stream`, captured into a CUDA graph and
// instantiated; destroyed with the object.
class CapturedGraph {
 public:
  template <class Enqueue>
  CapturedGraph(cudaStream_t stream, Enqueue&& enqueue) {
    MOK_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    enqueue();
    MOK_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
    MOK_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  ~CapturedGraph() {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void launch(cudaStream_t stream) const { MOK_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

std::vector<uint16_t> one_pass(mok::FusedForward& forward, mok::DeviceLayer& device) {
  device.poison_outputs();
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  forward.run(device.tensors());
  forward.check();
  return device.download_outputs();
}

// check() must throw the bad id of `rank` (token 3, slot 1: id 99).
void expect_bad_id_reported(mok::FusedForward& forward, int rank = 1) {
  try {
    forward.check();
    ADD_FAILURE() << "check() returned before the pass reported its bad expert id";
  } catch (const mok::Error& e) {
    const std::string says = "rank " + std::to_string(rank) + ", token 3, slot 1: expert id 99";
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

mok::synthetic::Layer layer_with_a_bad_id(const mok::LayerConfig& config) {
  auto layer = mok::synthetic::make_layer(config, 2);
  layer.expert_ids[1][3 * config.top_k + 1] = 99;
  return layer;
}

// Runs a's pass behind a stream held for kHoldMs, then b's pass on another
// stream; b moves every tensor, so its tensor maps are rebuilt. Unordered,
// they would land while a's pass has not read its own yet.
void run_held_pass_then_switch_streams(mok::FusedForward& forward, mok::DeviceLayer& a, mok::DeviceLayer& b) {
  Stream first, second;
  a.poison_outputs();
  b.poison_outputs();
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
  hold_stream(first.get(), kHoldMs);
  forward.run(a.tensors(), first.get());
  forward.run(b.tensors(), second.get());
  forward.check(second.get());
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(PassOrdering, SwitchingStreamsNeverOverwritesTheMapsOfARunningPass) {
  MOK_REQUIRE_HOPPER();
  const auto config = mok::make_config(mok::find_shape("small"), 2, 64);
  const auto layer_a = mok::synthetic::make_layer(config, 11);
  const auto layer_b = mok::synthetic::make_layer(config, 12);
  mok::DeviceLayer a(layer_a), b(layer_b);
  mok::FusedForward forward(config, small_ring());
  const auto want_a = one_pass(forward, a);
  const auto want_b = one_pass(forward, b);
  ASSERT_NE(want_a, want_b);
  (void)one_pass(forward, a);  // the maps describe a's tensors again

  run_held_pass_then_switch_streams(forward, a, b);
  EXPECT_EQ(a.download_outputs(), want_a) << "a's pass read b's tensor maps";
  EXPECT_EQ(b.download_outputs(), want_b);
}

TEST(PassOrdering, DeviceOrderedPassesFollowEachOtherAcrossStreamsToo) {
  MOK_REQUIRE_HOPPER();
  const auto config = mok::make_config(mok::find_shape("small"), 2, 64);
  const auto layer_a = mok::synthetic::make_layer(config, 13);
  const auto layer_b = mok::synthetic::make_layer(config, 14);
  mok::DeviceLayer a(layer_a), b(layer_b);
  mok::FusedForward host_ordered(config, small_ring());
  const auto want_a = one_pass(host_ordered, a);
  const auto want_b = one_pass(host_ordered, b);
  auto options = small_ring();
  options.device_ordered = true;
  mok::FusedForward forward(config, options);
  (void)one_pass(forward, a);
  run_held_pass_then_switch_streams(forward, a, b);
  EXPECT_EQ(a.download_outputs(), want_a);
  EXPECT_EQ(b.download_outputs(), want_b);
}

TEST(Check, WaitsForAPassOnANonBlockingStreamInTheVirtualWorld) {
  MOK_REQUIRE_HOPPER();
  const auto config = mok::make_config(mok::find_shape("small"), 2, 16);
  mok::DeviceLayer bad(layer_with_a_bad_id(config));
  mok::FusedForward forward(config, small_ring());
  Stream stream;
  hold_stream(stream.get(), kHoldMs);
  forward.run(bad.tensors(), stream.get());
  expect_bad_id_reported(forward);  // check() on the default stream, which does not wait for `stream`
}

TEST(Check, WaitsForAPassOnANonBlockingStreamInThePeerWorld) {
  MOK_REQUIRE_HOPPER();
  const int gpus = mok::detail::hopper_device_count();
  const int world = gpus >= 2 ? 2 : 1;
  std::vector<int> devices;
  for (int r = 0; r < world; ++r) devices.push_back(r);
  const auto config = mok::make_config(mok::find_shape("small"), world, 16);
  auto layer = mok::synthetic::make_layer(config, 2);
  layer.expert_ids[static_cast<size_t>(world - 1)][3 * config.top_k + 1] = 99;
  mok::DeviceLayer bad(layer, devices);
  auto options = small_ring();
  options.devices = devices;
  mok::FusedForward forward(config, options);
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<CUstream_st*> raw;
  for (int r = 0; r < world; ++r) {
    MOK_CUDA_CHECK(cudaSetDevice(devices[static_cast<size_t>(r)]));
    streams.push_back(std::make_unique<Stream>());
    raw.push_back(streams.back()->get());
    hold_stream(streams.back()->get(), kHoldMs);
  }
  MOK_CUDA_CHECK(cudaSetDevice(0));
  forward.run(bad.tensors(), raw);
  // The single-stream check(): it used to wait on each GPU's default stream only.
  expect_bad_id_reported(forward, world - 1);
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(WorldLifetime, DestroyingAWorldLeavesTheCallersGpuCurrent) {
  MOK_REQUIRE_HOPPER();
  const int gpus = mok::detail::hopper_device_count();
  if (gpus < 2) GTEST_SKIP() << "needs 2 or more Hopper GPUs (found " << gpus << ")";
  const auto config = mok::make_config(mok::find_shape("small"), 2, 16);
  int current = -1;
  {
    MOK_CUDA_CHECK(cudaSetDevice(1));
    auto options = small_ring();
    options.devices = {0, 1};  // frees memory on GPU 0 last
    mok::FusedForward peer(config, options);
  }
  MOK_CUDA_CHECK(cudaGetDevice(&current));
  EXPECT_EQ(current, 1) << "the peer world's destructor left another GPU current";
  {
    MOK_CUDA_CHECK(cudaSetDevice(0));
    mok::FusedForward on_gpu0(config, small_ring());
    MOK_CUDA_CHECK(cudaSetDevice(1));
  }
  MOK_CUDA_CHECK(cudaGetDevice(&current));
  EXPECT_EQ(current, 1) << "the virtual world's destructor left its own GPU current";
  MOK_CUDA_CHECK(cudaSetDevice(0));
}

TEST(ProcessWorld, CheckAfterClosePeersStillReportsTheLastPass) {
  MOK_REQUIRE_HOPPER();
  // A world of one rank: rank 0's workspace is this process's own, so this
  // checks the behaviour (the report survives close_peers), not the null
  // mapping a rank > 0 had; that needs two processes (python/tests).
  const auto config = mok::make_config(mok::find_shape("small"), 1, 16);
  auto layer = mok::synthetic::make_layer(config, 2);
  layer.expert_ids[0][3 * config.top_k + 1] = 99;
  mok::DeviceLayer bad(layer);
  auto options = small_ring();
  options.process_rank = 0;
  mok::FusedForward forward(config, options);
  forward.run(bad.tensors()[0]);
  forward.close_peers();
  expect_bad_id_reported(forward, 0);
}

}  // namespace

namespace {

// A peer world's pass captured on a non-blocking stream and replayed behind
// a held stream: the single-stream check() has no pass event to wait on (a
// capture records none) and one stream cannot name one on each GPU, so it
// synchronizes the world's GPUs. It used to wait on their default streams,
// which a non-blocking stream does not join: the outputs were read before
// the replay wrote them (review of 2026-12-01, section 5, item 5).
TEST(GraphCapture, APeerWorldsReplayIsWaitedForByTheSingleStreamCheck) {
  MOK_REQUIRE_HOPPER();
  const auto config = mok::make_config(mok::find_shape("small"), 1, 96);
  const std::vector<int> devices = {0};
  mok::DeviceLayer layer(mok::synthetic::make_layer(config, 41), devices);
  auto options = small_ring();
  options.devices = devices;
  mok::FusedForward forward(config, options);
  const std::vector<uint16_t> eager = one_pass(forward, layer);

  Stream stream;
  const std::vector<cudaStream_t> streams = {stream.get()};
  const CapturedGraph graph(stream.get(), [&] { forward.run(layer.tensors(), streams); });
  for (int replay = 0; replay < 2; ++replay) {
    layer.poison_outputs();
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
    hold_stream(stream.get(), kHoldMs);
    graph.launch(stream.get());
    forward.check(stream.get());
    EXPECT_EQ(layer.download_outputs(), eager) << "replay " << replay;
  }
  MOK_CUDA_CHECK(cudaDeviceSynchronize());
}

// A pass captured in a CUDA graph replays the tensors it was captured with;
// one whose tensor maps would have to be built during the capture is refused
// (the capture would record a host copy that replays stale maps).
TEST(GraphCapture, APassWithTheLastPassesTensorsReplaysItsBitsAndOneWithNewTensorsIsRefused) {
  MOK_REQUIRE_HOPPER();
  const auto config = mok::make_config(mok::find_shape("small"), 2, 96);
  mok::FusedForward forward(config, small_ring());
  mok::DeviceLayer first(mok::synthetic::make_layer(config, 31));
  mok::DeviceLayer second(mok::synthetic::make_layer(config, 32));
  const std::vector<uint16_t> eager = one_pass(forward, first);

  Stream stream;
  {
    const CapturedGraph graph(stream.get(), [&] { forward.run(first.tensors(), stream.get()); });
    for (int replay = 0; replay < 3; ++replay) {
      first.poison_outputs();
      MOK_CUDA_CHECK(cudaDeviceSynchronize());
      graph.launch(stream.get());
      forward.check(stream.get());
      EXPECT_EQ(first.download_outputs(), eager) << "replay " << replay;
    }
    MOK_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  }

  MOK_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal));
  try {
    forward.run(second.tensors(), stream.get());
    ADD_FAILURE() << "a capture that needed new tensor maps was accepted";
  } catch (const mok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("captured in a CUDA graph"), std::string::npos) << e.what();
  }
  cudaGraph_t abandoned = nullptr;
  cudaStreamEndCapture(stream.get(), &abandoned);
  if (abandoned != nullptr) cudaGraphDestroy(abandoned);
  cudaGetLastError();
  // The world is intact: an eager pass with the new tensors runs.
  mok::DeviceLayer& again = second;
  EXPECT_FALSE(one_pass(forward, again).empty());
}

}  // namespace
