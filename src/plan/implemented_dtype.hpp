// A LayerConfig may describe every DType (validate() accepts them), but not
// every computation implements each: the fused forward and the CPU
// reference's forward compute bf16 and fp8 (the FP8 recipe, with their own
// shape rules), the fused backward and the reference backward bf16 only.
// Each entry point refuses what it does not implement up front, in the same
// words, instead of failing later or silently computing in bf16.
#pragma once

#include <string>

#include "mok/error.hpp"
#include "mok/layer_config.hpp"

namespace mok::plan {

inline void require_implemented_dtype(const LayerConfig& config, const char* who) {
  if (config.dtype != DType::kBF16) {
    throw Error(std::string("dtype = ") + dtype_name(config.dtype) + ": not implemented yet in " + who +
                " (bf16 only)");
  }
}

}  // namespace mok::plan
