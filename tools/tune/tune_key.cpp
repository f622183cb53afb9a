// The tuning cache's key (tune_key.hpp): the same string as Python's TuneKey.id().
#include "tune/tune_key.hpp"

#include <algorithm>
#include <string>

namespace mok::tune {

std::string TuneKey::id() const {
  std::string out;
  auto field = [&](const std::string& text) {
    if (!out.empty()) out += '|';
    out += text;
  };
  field(gpu);
  field(std::to_string(sms));
  field(cuda);
  field(driver);
  field(std::to_string(hidden));
  field(std::to_string(intermediate));
  field(std::to_string(experts));
  field(std::to_string(top_k));
  field(std::to_string(shared));
  field(std::to_string(tokens_bucket));
  field(std::to_string(world));
  field(precision);
  field(pass_name);
  return out;
}

// Python computes 1 << ceil(log2(tokens)) in floating point; for any token
// count an int holds that is the least power of two >= tokens, which integer
// doubling gives exactly.
int64_t tokens_bucket(int64_t tokens) {
  int64_t bucket = 1;
  while (bucket < tokens) bucket *= 2;
  return std::max<int64_t>(256, bucket);
}

std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

TuneKey forward_key(const GpuFacts& gpu, const LayerConfig& config) {
  TuneKey key;
  key.gpu = gpu.name;
  key.sms = gpu.sms;
  key.cuda = gpu.cuda;
  key.driver = gpu.driver;
  key.hidden = config.hidden;
  key.intermediate = config.intermediate;
  key.experts = config.num_experts;
  key.top_k = config.top_k;
  key.shared = config.shared_width();
  const auto largest = std::max_element(config.tokens_per_rank.begin(), config.tokens_per_rank.end());
  key.tokens_bucket = tokens_bucket(largest == config.tokens_per_rank.end() ? 0 : *largest);
  key.world = config.world_size;
  key.precision = config.dtype == DType::kFP8E4M3 ? "fp8" : "bf16";
  return key;
}

}  // namespace mok::tune
