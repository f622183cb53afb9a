// What a tuning cache entry is for: the C++ twin of python/mok/tune.py's
// TuneKey. id() must give the same string as TuneKey.id() for the same
// facts, character for character: it is the entry's name in the cache file
// both tuners write and the Python front reads (tests/cpu/test_tuning_cache.cpp
// checks it against a string Python produced).
#pragma once

#include <cstdint>
#include <string>

#include "mok/layer_config.hpp"

namespace mok::tune {

// The GPU and software a measurement was made on: a tuned choice is only
// trusted on the same ones.
struct GpuFacts {
  std::string name;    // cudaDeviceProp::name ("NVIDIA H200"), as torch reports it
  int sms = 0;         // multiprocessors
  std::string cuda;    // "13.0": Python takes torch.version.cuda (the CUDA torch was built with),
                       // mok_cli the CUDA it was built with; where the two differ, so do the keys
  std::string driver;  // cuDriverGetVersion's number, "13000" for 13.0
};

struct TuneKey {
  // The fields of Python's TuneKey, in its order (id() joins them in it).
  std::string gpu;
  int sms = 0;
  std::string cuda;
  std::string driver;
  int hidden = 0;
  int intermediate = 0;
  int experts = 0;
  int top_k = 0;
  int shared = 0;              // the shared FFN's width (0: none)
  int64_t tokens_bucket = 0;   // tokens per rank, rounded up to a power of two (at least 256)
  int world = 0;
  std::string precision = "bf16";
  std::string pass_name = "forward";

  // The fields' values joined by '|', as Python's str() writes them.
  std::string id() const;
};

// Python's tokens_bucket(): the least power of two >= tokens, at least 256.
int64_t tokens_bucket(int64_t tokens);

// "13.0" from a CUDA version number (CUDART_VERSION, 13000), as torch.version.cuda reads.
std::string cuda_version_text(int version);

// The key of the forward of `config` on `gpu`, with the facts the Python
// front uses (mok/__init__.py _resolve_tuning): the largest rank's tokens,
// the world's size, the shared expert's width.
TuneKey forward_key(const GpuFacts& gpu, const LayerConfig& config);

}  // namespace mok::tune
