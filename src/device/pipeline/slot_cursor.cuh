// Where a role is in a ring of mbarrier-guarded slots (the CTA's task,
// fetch and done queues): the slot index and the parity of the phase it
// waits for. Every role that uses a queue keeps its own cursor and walks the
// same slot sequence; a waiter on a "full" barrier waits for `phase`, a
// producer on an "empty" barrier for `phase ^ 1` (so a fresh ring does not
// block it). StageRing (stage_ring.cuh) is the same walk for TMA stages.
#pragma once

#include <cstdint>

namespace mok::device {

template <int kSlots>
struct SlotCursor {
  int slot = 0;
  uint32_t phase = 0;

  __device__ __forceinline__ void advance() {
    if (++slot == kSlots) {
      slot = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace mok::device
