#include "world/pass_launch.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/cuda_check.hpp"
#include "mok/error.hpp"
#include "world/device_scope.hpp"
#include "world/fused_kernel.hpp"
#include "world/rank_tensors.hpp"
#include "world/tensor_maps.hpp"

namespace mok::world {
namespace {

bool any_capturing(const WorldState& s, std::span<const cudaStream_t> streams) {
  bool capturing = false;
  for (size_t i = 0; i < s.launches.size(); ++i) {
    DeviceScope on(s.launches[i].device);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    MOK_CUDA_CHECK(cudaStreamIsCapturing(streams[i], &status));
    capturing = capturing || status != cudaStreamCaptureStatusNone;
  }
  return capturing;
}

bool maps_moved(const WorldState& s, const std::vector<RankTensors>& tensors) {
  if (s.last_tensors.size() != tensors.size()) return true;
  for (size_t j = 0; j < tensors.size(); ++j) {
    if (tensor_maps_moved(s.last_tensors[j], tensors[j])) return true;
  }
  return false;
}

}  // namespace

void launch_pass(WorldState& s, World& world, std::vector<RankTensors> tensors, std::span<const cudaStream_t> streams) {
  if (s.broken) {
    throw Error("run: an earlier pass broke this world's barrier (a rank never started or finished a pass); "
                "this object cannot order passes any more: make a new one");
  }
  const bool capturing = any_capturing(s, streams);
  if (capturing && s.device_ordered()) {
    // The pass number is a kernel parameter: a replayed graph would run stale
    // passes the world barrier cannot order.
    throw Error("run: device-ordered passes cannot be captured in a CUDA graph (each pass's number is a kernel "
                "parameter); use the host-ordered virtual or peer world for graphs");
  }
  if (s.device_ordered() && s.epoch == UINT32_MAX) throw Error("run: this world ran 2^32 - 1 passes; make a new one");
  const int first_rank = s.launches.front().first_rank;
  // A device-ordered pass that failed on some launch has used up its number
  // there and not on the others: the world can no longer be ordered.
  try {
    // 1. Captured passes are ordered by the graph's stream instead (an event
    //    recorded outside the capture cannot be waited on inside it).
    if (!capturing && s.pass_done_recorded) {
      for (size_t i = 0; i < s.launches.size(); ++i) {
        DeviceScope on(s.launches[i].device);
        MOK_CUDA_CHECK(cudaStreamWaitEvent(streams[i], s.pass_done[i], 0));
      }
    }
    world.before_workspace(s, streams, tensors);

    const bool moved = maps_moved(s, tensors);
    for (size_t j = 0; j < tensors.size(); ++j) {
      device::RankView& v = s.params.ranks[first_rank + static_cast<int>(j)];
      v.x = static_cast<const uint16_t*>(tensors[j].x);
      v.ids = tensors[j].expert_ids;
      v.weights = tensors[j].weights;
      v.out = static_cast<uint16_t*>(tensors[j].out);
      s.use_pass_state(first_rank + static_cast<int>(j), tensors[j].pass_state);
    }
    if (s.device_ordered()) s.params.epoch = ++s.epoch;
    s.bind_counters(s.params.epoch);

    // 3. Tensor maps change only when a tensor moves; steady-state runs skip them.
    for (size_t i = 0; i < s.launches.size(); ++i) {
      const Launch& launch = s.launches[i];
      DeviceScope on(launch.device);
      for (int r = launch.first_rank; r < launch.first_rank + launch.ranks; ++r) {
        if (moved) {
          upload_tensor_maps(s.config, s.options, s.params.ranks[r], tensors[static_cast<size_t>(r - first_rank)], r,
                             streams[i]);
        }
        if (!s.device_ordered()) s.zero_counters(r, streams[i]);
      }
      if (s.trace_memory != nullptr && launch.first_rank == 0) {  // the trace is on rank 0's GPU
        MOK_CUDA_CHECK(cudaMemsetAsync(s.trace_memory, 0, s.trace_count_bytes(), streams[i]));
      }
    }
    world.before_launch(s, streams);

    for (size_t i = 0; i < s.launches.size(); ++i) {
      const Launch& launch = s.launches[i];
      DeviceScope on(launch.device);
      device::FusedForwardParams mine = s.params;
      mine.first_rank = launch.first_rank;
      mine.launch_ranks = launch.ranks;
      launch_fused_kernel(mine, launch.ranks * s.options.ctas_per_rank, streams[i], s.system_scope());
      if (!capturing) MOK_CUDA_CHECK(cudaEventRecord(s.pass_done[i], streams[i]));
    }
    s.pass_done_recorded = !capturing;
    if (moved) s.last_tensors = std::move(tensors);
  } catch (...) {
    if (s.device_ordered()) s.broken = true;
    throw;
  }
}

void wait_for_last_pass(const WorldState& s, std::span<const cudaStream_t> streams) {
  if (s.pass_done_recorded) {
    for (size_t i = 0; i < s.launches.size(); ++i) {
      DeviceScope on(s.launches[i].device);
      MOK_CUDA_CHECK(cudaEventSynchronize(s.pass_done[i]));
    }
    return;
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    DeviceScope on(s.launches[std::min(i, s.launches.size() - 1)].device);
    MOK_CUDA_CHECK(cudaStreamSynchronize(streams[i]));
  }
}

}  // namespace mok::world
