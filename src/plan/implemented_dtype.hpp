// A LayerConfig may describe every DType (validate() accepts them), but the
// computations implement bf16 only so far. Each entry point that computes
// (the fused forward, the CPU reference) refuses the others up front, in the
// same words, instead of failing later or silently computing in bf16.
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
