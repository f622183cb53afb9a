#include "world/backward_steps.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "common/cuda_check.hpp"
#include "world/backward_kernel.hpp"
#include "world/backward_views.hpp"
#include "world/device_scope.hpp"
#include "world/pass_launch.hpp"

namespace mok::world {
namespace {

class BackwardSteps final : public world::PassSteps {
 public:
  BackwardSteps(BackwardState& s, std::span<const BackwardRankTensors> ranks, const BackwardMaps& maps,
                bool accumulate, bool bf16_grads, bool& numbered, bool& launched)
      : s_(s), ranks_(ranks), maps_(maps), accumulate_(accumulate), bf16_grads_(bf16_grads), numbered_(numbered),
        launched_(launched) {}

  void bind(std::span<const cudaStream_t> streams) override {
    if (s_.core.device_ordered()) {
      ++s_.core.epoch;
      numbered_ = true;
    }
    if (s_.world->stages_inputs()) stage_inputs(streams[0]);
    const int first = s_.core.launches.front().first_rank;
    s_.with_params([&](auto& p) {
      bind_backward_counters(s_, p, s_.core.epoch);
      p.accumulate = accumulate_ ? 1 : 0;
      p.weight_grad_bf16 = bf16_grads_ ? 1 : 0;
      for (int r = first; r < first + static_cast<int>(ranks_.size()); ++r) {
        const BackwardRankTensors& t = ranks_[static_cast<size_t>(r - first)];
        auto& v = p.ranks[r];
        auto* state = static_cast<uint8_t*>(const_cast<void*>(t.pass_state));
        v.expert_rows = reinterpret_cast<int32_t*>(state + s_.pass_state.expert_rows.offset);
        v.rows = reinterpret_cast<RowSource*>(state + s_.pass_state.rows.offset);
        // A process world's rank reads the staged copies (fill_view), as its
        // peers do: the same bytes, and its own tests then cover them.
        if (!s_.world->stages_inputs()) {
          v.expert_offset = reinterpret_cast<int32_t*>(state + s_.pass_state.expert_offset.offset);
          v.x = static_cast<const uint16_t*>(t.x);
          v.dout = static_cast<const uint16_t*>(t.dout);
          v.weights = t.weights;
        }
        // Recompute mode: the pre-activations its own gate/up tasks keep.
        v.preact = v.kept_preact != nullptr ? v.kept_preact : static_cast<const uint16_t*>(t.preact);
        v.shared_preact =
            v.kept_preact != nullptr ? v.kept_shared_preact : static_cast<const uint16_t*>(t.shared_preact);
        v.dx = static_cast<uint16_t*>(t.dx);
        v.dweights = t.dweights;
        v.dw13 = t.dw13;
        v.dw2 = t.dw2;
        v.dshared_w13 = t.dshared_w13;
        v.dshared_w2 = t.dshared_w2;
      }
    });
  }

  // The process world: peers read this rank's x, dout and routing weights
  // (the pull dispatch) and the end of its schedule's expert offsets (the
  // combine) in its workspace: a caller's tensors are not IPC-visible. Safe
  // to overwrite once the previous pass's kernel has ended (the pass waited
  // for it): it ended only after every rank finished that pass (the end
  // barrier).
  void stage_inputs(cudaStream_t stream) {
    const int me = s_.core.process_rank;
    const world::BackwardRankLayout& g = s_.layout.ranks[static_cast<size_t>(me)];
    const BackwardRankTensors& mine = ranks_[0];
    uint8_t* base = s_.core.rank_base[static_cast<size_t>(me)];
    world::DeviceScope on(s_.core.rank_device[static_cast<size_t>(me)]);
    const void* expert_offset = static_cast<const uint8_t*>(mine.pass_state) + s_.pass_state.expert_offset.offset;
    const std::pair<const void*, world::Region> copies[] = {{mine.x, g.staged_x},
                                                            {mine.dout, g.staged_dout},
                                                            {mine.weights, g.staged_weights},
                                                            {expert_offset, g.staged_expert_offset}};
    for (const auto& [from, to] : copies) {
      if (to.bytes > 0) {
        MOK_CUDA_CHECK(cudaMemcpyAsync(base + to.offset, from, to.bytes, cudaMemcpyDeviceToDevice, stream));
      }
    }
  }

  // Its ranks' maps; host-ordered, their counter sets (the combine's
  // cursor with them) and the world's report words; the trace counts. The
  // first launch's GPU is the report GPU (rank 0's, or a process world's own).
  void prepare(size_t i, cudaStream_t stream) override {
    const world::Launch& launch = s_.core.launches[i];
    const int first = s_.core.launches.front().first_rank;
    const bool ordered = s_.core.device_ordered();
    for (int r = launch.first_rank; r < launch.first_rank + launch.ranks; ++r) {
      const world::BackwardRankLayout& g = s_.layout.ranks[static_cast<size_t>(r)];
      uint8_t* base = s_.core.rank_base[static_cast<size_t>(r)];
      MOK_CUDA_CHECK(cudaMemcpyAsync(base + g.maps.offset, maps_.sets[static_cast<size_t>(r - first)].data(),
                                     sizeof(CUtensorMap) * maps_.count, cudaMemcpyHostToDevice, stream));
      if (!ordered) MOK_CUDA_CHECK(cudaMemsetAsync(base + g.counters[0].offset, 0, g.counters[0].bytes, stream));
    }
    if (i == 0) {
      if (!ordered) s_.core.zero_report_words(stream);
      if (s_.core.trace_memory != nullptr) {
        MOK_CUDA_CHECK(cudaMemsetAsync(s_.core.trace_memory, 0, s_.core.trace_count_bytes(), stream));
      }
    }
  }

  void launch(size_t i, cudaStream_t stream) override {
    const world::Launch& launch = s_.core.launches[i];
    s_.with_params([&](auto& p) {
      auto mine = p;
      mine.first_rank = launch.first_rank;
      mine.launch_ranks = launch.ranks;
      launched_ = true;  // from here a failure may leave some launch enqueued
      world::launch_backward_kernel(mine, launch.ranks * s_.options.ctas_per_rank, stream,
                                    s_.core.system_scope());
    });
  }

 private:
  BackwardState& s_;
  std::span<const BackwardRankTensors> ranks_;
  const BackwardMaps& maps_;
  const bool accumulate_, bf16_grads_;
  bool& numbered_;
  bool& launched_;
};

}  // namespace

void enqueue_backward_pass(BackwardState& s, std::span<const BackwardRankTensors> ranks, const BackwardMaps& maps,
                           bool accumulate, bool bf16_grads, std::span<const cudaStream_t> streams) {
  bool numbered = false;  // device-ordered: this pass took a number
  bool launched = false;  // some launch of this pass is enqueued
  try {
    BackwardSteps steps(s, ranks, maps, accumulate, bf16_grads, numbered, launched);
    world::enqueue_pass(s.core, *s.world, steps, streams, /*capturing=*/false);
  } catch (...) {
    world::give_back_number(s.core, numbered, launched);
    throw;
  }
}

}  // namespace mok::world
