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
  // Tensor maps change only when a tensor moves; steady-state runs skip them.
  // They are built on the host and copied from it, which a graph capture
  // cannot record faithfully (it would replay whatever the host memory then
  // holds): a captured pass must reuse the maps of the pass before it.
  const bool moved = maps_moved(s, tensors);
  if (capturing && moved) {
    throw Error("run: a pass captured in a CUDA graph must use the tensors of the world's previous pass (their "
                "tensor maps are built on the host and cannot be captured): run one pass with these tensors "
                "outside the capture first, and replay the graph only while the world's passes use them");
  }
  // Everything that can fail on the host alone comes first: a pass given up
  // here leaves the world as it was.
  std::vector<RankTensorMaps> maps;
  if (moved) {
    for (size_t j = 0; j < tensors.size(); ++j) {
      const int r = first_rank + static_cast<int>(j);
      maps.push_back(encode_tensor_maps(s.config, s.options, s.params.ranks[r], tensors[j], r));
    }
  }
  bool training = false;  // some rank keeps its pre-activations: the training kernel
  bool numbered = false;  // device-ordered: this pass took a number
  bool launched = false;  // some launch of this pass is enqueued
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

    for (size_t j = 0; j < tensors.size(); ++j) {
      device::RankView& v = s.params.ranks[first_rank + static_cast<int>(j)];
      v.tokens = pass_tokens(s.config, tensors[j], first_rank + static_cast<int>(j));
      v.x = static_cast<const uint16_t*>(tensors[j].x);
      v.ids = tensors[j].expert_ids;
      v.weights = tensors[j].weights;
      v.out = static_cast<uint16_t*>(tensors[j].out);
      s.use_pass_state(first_rank + static_cast<int>(j), tensors[j].pass_state);
      s.params.saved[first_rank + static_cast<int>(j)] = {static_cast<uint16_t*>(tensors[j].preact),
                                                            static_cast<uint16_t*>(tensors[j].shared_preact)};
      // The FP8 forward's weight scales (null in bf16, where check_rank_tensors refused any).
      device::Fp8RankOperands& q = s.params.fp8[first_rank + static_cast<int>(j)];
      q.w13_scales = static_cast<const uint8_t*>(tensors[j].w13_scales);
      q.w2_scales = static_cast<const uint8_t*>(tensors[j].w2_scales);
      training = training || tensors[j].preact != nullptr || tensors[j].shared_preact != nullptr;
    }
    if (s.device_ordered()) {
      s.params.epoch = ++s.epoch;
      numbered = true;
    }
    s.bind_counters(s.params.epoch);

    // 2. The maps (when a tensor moved), the counters (host-ordered), the trace.
    for (size_t i = 0; i < s.launches.size(); ++i) {
      const Launch& launch = s.launches[i];
      DeviceScope on(launch.device);
      for (int r = launch.first_rank; r < launch.first_rank + launch.ranks; ++r) {
        if (moved) upload_tensor_maps(maps[static_cast<size_t>(r - first_rank)], s.params.ranks[r], streams[i]);
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
      launched = true;  // from here a failure may leave some launch enqueued
      launch_fused_kernel(mine, launch.ranks * s.options.ctas_per_rank, streams[i], s.system_scope(), training,
                          s.config.dtype == DType::kFP8E4M3);
      if (!capturing) MOK_CUDA_CHECK(cudaEventRecord(s.pass_done[i], streams[i]));
    }
    s.pass_done_recorded = !capturing;
    if (moved) s.last_tensors = std::move(tensors);
  } catch (...) {
    // A device-ordered pass that reached a launch has used up its number
    // there and maybe not on the other launches: the world can no longer be
    // ordered. One that failed before any launch gives its number back.
    if (numbered && launched) s.broken = true;
    if (numbered && !launched) s.params.epoch = --s.epoch;
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
