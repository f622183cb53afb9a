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

bool maps_moved(const WorldState& s, const std::vector<RankTensors>& tensors) {
  if (s.last_tensors.size() != tensors.size()) return true;
  for (size_t j = 0; j < tensors.size(); ++j) {
    if (tensor_maps_moved(s.last_tensors[j], tensors[j])) return true;
  }
  return false;
}

// The forward's part of each step (enqueue_pass).
class ForwardSteps final : public PassSteps {
 public:
  ForwardSteps(WorldState& s, World& world, std::vector<RankTensors>& tensors, std::vector<RankTensorMaps>& maps,
               bool moved, bool& numbered, bool& launched)
      : s_(s), world_(world), tensors_(tensors), maps_(maps), moved_(moved), numbered_(numbered),
        launched_(launched) {}

  void bind(std::span<const cudaStream_t> streams) override {
    if (world_.stages_inputs()) stage_inputs(streams[0]);
    const int first_rank = s_.launches.front().first_rank;
    for (size_t j = 0; j < tensors_.size(); ++j) {
      const int r = first_rank + static_cast<int>(j);
      const RankTensors& t = tensors_[j];
      device::RankView& v = s_.params.ranks[r];
      v.tokens = pass_tokens(s_.config, t, r);
      v.x = static_cast<const uint16_t*>(t.x);
      v.ids = t.expert_ids;
      v.weights = t.weights;
      v.out = static_cast<uint16_t*>(t.out);
      s_.use_pass_state(r, t.pass_state);
      s_.params.saved[r] = {static_cast<uint16_t*>(t.preact), static_cast<uint16_t*>(t.shared_preact)};
      // The FP8 forward's weight scales (null in bf16, where check_rank_tensors refused any).
      device::Fp8RankOperands& q = s_.params.fp8[r];
      q.w13_scales = static_cast<const uint8_t*>(t.w13_scales);
      q.w2_scales = static_cast<const uint8_t*>(t.w2_scales);
      training_ = training_ || t.preact != nullptr || t.shared_preact != nullptr;
    }
    if (s_.device_ordered()) {
      s_.params.epoch = ++s_.epoch;
      numbered_ = true;
    }
    s_.bind_counters(s_.params.epoch);
  }

  // The process world: peers read this rank's x and ids in its workspace.
  // Safe to overwrite once the previous pass's kernel has ended (the pass
  // waited for it): it ended only after every rank finished that pass (the
  // end barrier).
  void stage_inputs(cudaStream_t stream) {
    const int me = s_.process_rank;
    const RankLayout& L = s_.layouts[static_cast<size_t>(me)];
    const size_t T = static_cast<size_t>(s_.config.tokens_per_rank[static_cast<size_t>(me)]);
    RankTensors& mine = tensors_[0];
    uint8_t* base = s_.rank_base[static_cast<size_t>(me)];
    if (T > 0) {
      DeviceScope on(s_.rank_device[static_cast<size_t>(me)]);
      MOK_CUDA_CHECK(cudaMemcpyAsync(base + L.staged_x.offset, mine.x, L.staged_x.bytes, cudaMemcpyDeviceToDevice,
                                     stream));
      MOK_CUDA_CHECK(cudaMemcpyAsync(base + L.staged_ids.offset, mine.expert_ids, L.staged_ids.bytes,
                                     cudaMemcpyDeviceToDevice, stream));
    }
    mine.x = base + L.staged_x.offset;
    mine.expert_ids = reinterpret_cast<const int32_t*>(base + L.staged_ids.offset);
  }

  // The maps (when a tensor moved), the counters (host-ordered), the trace.
  void prepare(size_t i, cudaStream_t stream) override {
    const Launch& launch = s_.launches[i];
    const int first_rank = s_.launches.front().first_rank;
    for (int r = launch.first_rank; r < launch.first_rank + launch.ranks; ++r) {
      if (moved_) upload_tensor_maps(maps_[static_cast<size_t>(r - first_rank)], s_.params.ranks[r], stream);
      if (!s_.device_ordered()) s_.zero_counters(r, stream);
    }
    if (s_.trace_memory != nullptr && launch.first_rank == 0) {  // the trace is on rank 0's GPU
      MOK_CUDA_CHECK(cudaMemsetAsync(s_.trace_memory, 0, s_.trace_count_bytes(), stream));
    }
  }

  void launch(size_t i, cudaStream_t stream) override {
    const Launch& launch = s_.launches[i];
    device::FusedForwardParams mine = s_.params;
    mine.first_rank = launch.first_rank;
    mine.launch_ranks = launch.ranks;
    launched_ = true;  // from here a failure may leave some launch enqueued
    launch_fused_kernel(mine, launch.ranks * s_.options.ctas_per_rank, stream, s_.system_scope(), training_,
                        s_.config.dtype == DType::kFP8E4M3);
  }

 private:
  WorldState& s_;
  World& world_;
  std::vector<RankTensors>& tensors_;
  std::vector<RankTensorMaps>& maps_;
  const bool moved_;
  bool& numbered_;
  bool& launched_;
  bool training_ = false;  // some rank keeps its pre-activations: the training kernel
};

}  // namespace

void launch_pass(WorldState& s, World& world, std::vector<RankTensors> tensors, std::span<const cudaStream_t> streams) {
  const bool capturing = any_capturing(s, streams);
  require_orderable(s, capturing, "run");
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
  bool numbered = false;  // device-ordered: this pass took a number
  bool launched = false;  // some launch of this pass is enqueued
  try {
    ForwardSteps steps(s, world, tensors, maps, moved, numbered, launched);
    enqueue_pass(s, world, steps, streams, capturing);
    if (moved) s.last_tensors = std::move(tensors);
  } catch (...) {
    give_back_number(s, numbered, launched);
    s.params.epoch = s.epoch;
    throw;
  }
}

void require_orderable(const WorldCore& core, bool capturing, const std::string& who) {
  if (core.broken) {
    throw Error(who + ": an earlier pass broke this world's barrier (a rank never started or finished a pass); "
                "this object cannot order passes any more: make a new one");
  }
  if (capturing && core.device_ordered()) {
    // The pass number is a kernel parameter: a replayed graph would run stale
    // passes the world barrier cannot order.
    throw Error(who + ": device-ordered passes cannot be captured in a CUDA graph (each pass's number is a "
                "kernel parameter); use the host-ordered virtual or peer world for graphs");
  }
  if (core.device_ordered() && core.epoch == UINT32_MAX) {
    throw Error(who + ": this world ran 2^32 - 1 passes; make a new one");
  }
}

void give_back_number(WorldCore& core, bool numbered, bool launched) {
  // A device-ordered pass that reached a launch has used up its number
  // there and maybe not on the other launches: the world can no longer be
  // ordered. One that failed before any launch gives its number back.
  if (numbered && launched) core.broken = true;
  if (numbered && !launched) --core.epoch;
}

void enqueue_pass(WorldCore& core, World& world, PassSteps& steps, std::span<const cudaStream_t> streams,
                  bool capturing) {
  if (!capturing && core.pass_done_recorded) {
    for (size_t i = 0; i < core.launches.size(); ++i) {
      DeviceScope on(core.launches[i].device);
      MOK_CUDA_CHECK(cudaStreamWaitEvent(streams[i], core.pass_done[i], 0));
    }
  }
  world.before_workspace(core, streams);
  steps.bind(streams);
  for (size_t i = 0; i < core.launches.size(); ++i) {
    DeviceScope on(core.launches[i].device);
    steps.prepare(i, streams[i]);
  }
  world.before_launch(core, streams);
  for (size_t i = 0; i < core.launches.size(); ++i) {
    DeviceScope on(core.launches[i].device);
    steps.launch(i, streams[i]);
    if (!capturing) MOK_CUDA_CHECK(cudaEventRecord(core.pass_done[i], streams[i]));
  }
  core.pass_done_recorded = !capturing;
}

void wait_for_last_pass(const WorldCore& s, std::span<const cudaStream_t> streams) {
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

void wait_for_last_pass_on_every_gpu(const WorldCore& s) {
  if (s.pass_done_recorded) {
    wait_for_last_pass(s, {});
    return;
  }
  for (const auto& launch : s.launches) {
    DeviceScope on(launch.device);
    MOK_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

}  // namespace mok::world
