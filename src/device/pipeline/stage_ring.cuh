// A ring of shared-memory stages guarded by two mbarriers per stage:
//   full[s]  -- the producer arrives once with expect_tx(stage bytes); TMA
//               completes the transaction bytes; consumers wait on it.
//   empty[s] -- every consumer warp arrives once when its wgmma reading the
//               stage have retired; the producer waits on it before reuse.
//
// Each role keeps its own StageRing cursor (stage index + phase parity) and
// walks the same sequence of stages; advance() is called explicitly, once per
// stage used, by every role -- nothing advances behind the caller's back.
// The producer waits on empty with the opposite parity, so the first pass
// through a freshly initialised ring does not block.
#pragma once

#include <cstdint>

#include "device/ptx/async_copy.cuh"

namespace mok::device {

template <int kStages>
struct StageRing {
  uint64_t* full;   // [kStages]
  uint64_t* empty;  // [kStages]
  int stage = 0;
  uint32_t phase = 0;

  // One thread, before any role starts; `consumer_arrivals` = arrivals that
  // free a stage (one per consumer warp).
  __device__ static void init(uint64_t* full_bars, uint64_t* empty_bars, uint32_t consumer_arrivals) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full_bars[s], 1);
      mbarrier_init(&empty_bars[s], consumer_arrivals);
    }
    fence_barrier_init();
  }

  // Producer: wait until the current stage is free, then announce its bytes.
  __device__ uint64_t* producer_acquire(uint32_t stage_bytes) {
    mbarrier_wait_parity(&empty[stage], phase ^ 1u);
    mbarrier_arrive_expect_tx(&full[stage], stage_bytes);
    return &full[stage];
  }

  // Consumer: wait until the current stage's bytes have landed.
  template <class OnStall = TrapOnStall>
  __device__ void consumer_wait(const OnStall& on_stall = {}) {
    mbarrier_wait_parity(&full[stage], phase, on_stall);
  }

  // Consumer (one lane per warp): give stage `s` back to the producer.
  __device__ void consumer_release(int s) { mbarrier_arrive(&empty[s]); }

  __device__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace mok::device
