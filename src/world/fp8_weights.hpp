// A synthetic layer's routed experts in block-scaled FP8 on the GPU, as an
// fp8 layer's RankTensors take them: w13 / w2 as e4m3 values and their ue8m0
// scales (mok::fp8::quantize_weight, bit-exact: the CPU reference quantizes
// the same float weights to the same bytes). The companion of DeviceLayer
// for the GPU tests, the CLI and benchmarks; owns its allocations.
#pragma once

#include <memory>
#include <vector>

#include "mok/fused_forward.hpp"
#include "mok/synthetic.hpp"

namespace mok::world {

class Fp8RoutedWeights {
 public:
  // Quantizes rank r's experts (each expert on its own, on up to `threads`
  // host threads; 0: every core) and uploads them to the current GPU, or to
  // devices[r] (a peer world).
  explicit Fp8RoutedWeights(const synthetic::Layer& layer, const std::vector<int>& devices = {}, int threads = 0);
  ~Fp8RoutedWeights();
  Fp8RoutedWeights(const Fp8RoutedWeights&) = delete;
  Fp8RoutedWeights& operator=(const Fp8RoutedWeights&) = delete;

  // `tensors` (a DeviceLayer's, rank by rank) with each rank's w13 / w2
  // replaced by its e4m3 values and w13_scales / w2_scales set.
  std::vector<RankTensors> apply(std::vector<RankTensors> tensors) const;

 private:
  struct Rank {
    void* w13 = nullptr;         // e4m3 [El, 2I, H]
    void* w2 = nullptr;          // e4m3 [El, H, I]
    void* w13_scales = nullptr;  // ue8m0 [El, 2I / 128, H / 128]
    void* w2_scales = nullptr;   // ue8m0 [El, H / 128, I / 128]
  };
  std::vector<Rank> ranks_;
  std::vector<void*> allocations_;
};

}  // namespace mok::world
