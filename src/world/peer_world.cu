// The peer world: one process drives one GPU per rank, with peer access
// between all of them; rank r's workspace lives on its GPU, one launch per
// GPU, counters at system scope. Host-ordered passes order the GPUs with
// events only, never the host: every GPU marks "previous work done" and waits
// for all the others' before zeroing its counters, then marks "zeroed" and
// launches after all the others' "zeroed". (Never NVLink multicast: it can
// take a shared host's GPUs out of service.)
#include <string>

#include "common/cuda_check.hpp"
#include "mok/error.hpp"
#include "world/device_scope.hpp"
#include "world/world.hpp"

namespace mok::world {
namespace {

// One event per GPU: each records its own, then waits for every other's.
class GpuMeeting {
 public:
  explicit GpuMeeting(std::vector<int> devices) : devices_(std::move(devices)), events_(devices_.size(), nullptr) {
    for (size_t i = 0; i < devices_.size(); ++i) {
      DeviceScope on(devices_[i]);
      MOK_CUDA_CHECK(cudaEventCreateWithFlags(&events_[i], cudaEventDisableTiming));
    }
  }
  ~GpuMeeting() {
    for (size_t i = 0; i < devices_.size(); ++i) {
      try {
        DeviceScope on(devices_[i]);
        cudaEventDestroy(events_[i]);
      } catch (...) {
      }
    }
  }
  GpuMeeting(const GpuMeeting&) = delete;
  GpuMeeting& operator=(const GpuMeeting&) = delete;

  void meet(std::span<const cudaStream_t> streams) {
    for (size_t i = 0; i < devices_.size(); ++i) {
      DeviceScope on(devices_[i]);
      MOK_CUDA_CHECK(cudaEventRecord(events_[i], streams[i]));
    }
    for (size_t i = 0; i < devices_.size(); ++i) {
      DeviceScope on(devices_[i]);
      for (size_t q = 0; q < devices_.size(); ++q) {
        if (q != i) MOK_CUDA_CHECK(cudaStreamWaitEvent(streams[i], events_[q], 0));
      }
    }
  }

 private:
  std::vector<int> devices_;
  std::vector<cudaEvent_t> events_;
};

// Every GPU reads and writes every other's buffers: peer access both ways.
void enable_peer_access(const std::vector<int>& devices) {
  for (int a : devices) {
    DeviceScope on(a);
    for (int b : devices) {
      if (a == b) continue;
      int can = 0;
      MOK_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can) {
        throw Error("peer world: GPU " + std::to_string(a) + " cannot access GPU " + std::to_string(b) +
                    "'s memory (no peer access); every pair of its GPUs needs NVLink or PCIe P2P");
      }
      const cudaError_t status = cudaDeviceEnablePeerAccess(b, 0);
      if (status == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // fine: someone enabled it before us
      } else {
        MOK_CUDA_CHECK(status);
      }
    }
  }
}

class PeerWorld final : public World {
 public:
  bool allocates(int) const override { return true; }

  std::vector<Launch> launches(const WorldCore& s) const override {
    std::vector<Launch> all;
    for (int r = 0; r < s.world_size; ++r) all.push_back(Launch{s.rank_device[static_cast<size_t>(r)], r, 1});
    return all;
  }

  void connect(WorldCore& s) override {
    enable_peer_access(s.rank_device);
    if (!s.device_ordered()) {
      ready_ = std::make_unique<GpuMeeting>(s.rank_device);
      zeroed_ = std::make_unique<GpuMeeting>(s.rank_device);
    }
  }

  // Once every GPU got here, nobody still reads our counters or writes our
  // combine rows. (Device-ordered passes: the kernel's barriers order them.)
  void before_workspace(WorldCore&, std::span<const cudaStream_t> streams) override {
    if (ready_) ready_->meet(streams);
  }
  // Once every GPU's counters are zero, every GPU may start its rank.
  void before_launch(WorldCore&, std::span<const cudaStream_t> streams) override {
    if (zeroed_) zeroed_->meet(streams);
  }

 private:
  std::unique_ptr<GpuMeeting> ready_, zeroed_;
};

}  // namespace

std::unique_ptr<World> make_peer_world() { return std::make_unique<PeerWorld>(); }

}  // namespace mok::world
