#include "world/rank_tensors.hpp"

#include <cstdint>
#include <cstdio>
#include <string>

#include "mok/error.hpp"

namespace mok::world {
namespace {

// Messages here are built with std::to_string / snprintf, not iostreams: this
// code also runs inside the PyTorch extension, where formatting an integer
// through an ostream crashed (a libstdc++ mismatch in torch 2.11's process;
// docs/perf-notes.md, "torch extension").
std::string pointer_text(const void* p) {
  char text[32];
  std::snprintf(text, sizeof(text), "%p", p);
  return text;
}

void require_device_pointer(const void* p, const std::string& field, bool required) {
  if (p == nullptr) {
    if (required) throw Error(field + " is null");
    return;
  }
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    throw Error(field + " = " + pointer_text(p) + ": must be 16-byte aligned");
  }
}

}  // namespace

int pass_tokens(const LayerConfig& config, const RankTensors& t, int r) {
  return t.tokens < 0 ? config.tokens_per_rank[static_cast<size_t>(r)] : t.tokens;
}

int checked_pass_tokens(const LayerConfig& config, int tokens, int r, const std::string& who) {
  const int capacity = config.tokens_per_rank[static_cast<size_t>(r)];
  if (tokens < -1 || tokens > capacity) {
    throw Error(who + "tokens = " + std::to_string(tokens) + ": must be in [0, " + std::to_string(capacity) +
                "] (the layer's tokens_per_rank is the capacity), or -1 for the capacity");
  }
  return tokens < 0 ? capacity : tokens;
}

void check_rank_tensors(const LayerConfig& config, const RankTensors& t, int r) {
  const std::string rank = "rank " + std::to_string(r) + ": ";
  const bool has_tokens = checked_pass_tokens(config, t.tokens, r, rank) > 0;
  const bool has_shared = config.shared_width() > 0;
  require_device_pointer(t.x, rank + "x", has_tokens);
  require_device_pointer(t.out, rank + "out", has_tokens);
  require_device_pointer(t.w13, rank + "w13", true);
  require_device_pointer(t.w2, rank + "w2", true);
  require_device_pointer(t.shared_w13, rank + "shared_w13", has_shared);
  require_device_pointer(t.shared_w2, rank + "shared_w2", has_shared);
  require_device_pointer(t.pass_state, rank + "pass_state", false);
  if (config.dtype == DType::kFP8E4M3 && (t.preact != nullptr || t.shared_preact != nullptr)) {
    throw Error(rank + (t.preact != nullptr ? "preact" : "shared_preact") +
                " is given, but the fp8 forward has no training mode (no fused fp8 backward reads "
                "pre-activations): leave preact and shared_preact null");
  }
  require_device_pointer(t.preact, rank + "preact", false);
  require_device_pointer(t.shared_preact, rank + "shared_preact", false);
  if (t.preact != nullptr && t.pass_state == nullptr) {
    throw Error(rank + "preact needs pass_state: its rows are the schedule's, which the next pass would overwrite");
  }
  if (t.shared_preact != nullptr && !has_shared) {
    throw Error(rank + "shared_preact is given but the layer has no shared expert");
  }
  if (has_tokens && (t.expert_ids == nullptr || t.weights == nullptr)) {
    throw Error(rank + "expert_ids and weights must not be null");
  }
  // The weights' scales: byte arrays read with plain loads (never TMA), so
  // any alignment will do; only their presence is checked.
  if (config.dtype == DType::kFP8E4M3) {
    if (t.w13_scales == nullptr || t.w2_scales == nullptr) {
      throw Error(rank + (t.w13_scales == nullptr ? "w13_scales" : "w2_scales") +
                  " is null: an fp8 layer's w13 and w2 are e4m3 values with ue8m0 block scales "
                  "(mok::fp8::quantize_weight's values and scales)");
    }
  } else if (t.w13_scales != nullptr || t.w2_scales != nullptr) {
    throw Error(rank + (t.w13_scales != nullptr ? "w13_scales" : "w2_scales") + " is given, but the layer's dtype is " +
                dtype_name(config.dtype) + " (weight scales belong to an fp8 layer's e4m3 weights)");
  }
}

bool tensor_maps_moved(const RankTensors& before, const RankTensors& now) {
  return before.x != now.x || before.w13 != now.w13 || before.w2 != now.w2 || before.shared_w13 != now.shared_w13 ||
         before.shared_w2 != now.shared_w2 || before.tokens != now.tokens;  // x's map has the pass's rows
}

}  // namespace mok::world
