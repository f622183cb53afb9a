// A layer's tensors in device memory, split over the ranks of a world: what
// the fused kernels take (RankTensors), built from host data (a synthetic
// layer or any mok::LayerInputs-shaped floats rounded to bf16). Used by the
// CLI, the GPU tests and benchmarks; owns its allocations.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mok/fused_forward.hpp"
#include "mok/synthetic.hpp"

namespace mok {

class DeviceLayer {
 public:
  // Uploads x, routing and weights (rank r gets experts [r*E/R, (r+1)*E/R)) and
  // allocates each rank's output: all on the current GPU, or rank r's on
  // devices[r] when `devices` is given (a peer world; shared weights per GPU).
  explicit DeviceLayer(const synthetic::Layer& layer, const std::vector<int>& devices = {});
  ~DeviceLayer();
  DeviceLayer(const DeviceLayer&) = delete;
  DeviceLayer& operator=(const DeviceLayer&) = delete;

  const std::vector<RankTensors>& tensors() const { return tensors_; }
  // Fills every output with 0xFFFF (a bf16 NaN), so an unwritten element shows.
  void poison_outputs();
  // All ranks' outputs as bf16 bits, concatenated in global token order.
  std::vector<uint16_t> download_outputs() const;

 private:
  struct Buffers;
  std::unique_ptr<Buffers> buffers_;
  std::vector<RankTensors> tensors_;
};

}  // namespace mok
