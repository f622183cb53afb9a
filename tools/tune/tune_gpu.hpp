// mok_cli tune on the GPU (CUDA builds only): the search of tune_search.hpp,
// each comparison timed with mok_cli's paired rounds (forward_timing.hpp),
// the winner stored in the tuning cache.
#pragma once

#include "tune/tune_args.hpp"
#include "tune/tune_key.hpp"

namespace mok::tune {

// The current GPU's facts, as python/mok/tune.py's _gpu_facts reads them.
GpuFacts current_gpu_facts();

// Runs the tuner; 0 when the winner was stored.
int run_tune_on_gpu(const TuneArgs& args);

}  // namespace mok::tune
