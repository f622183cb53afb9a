// Command-line layer dims (layer_dims.hpp).
#include "layer_dims.hpp"

#include <charconv>
#include <system_error>

#include "mok/error.hpp"
#include "mok/presets.hpp"

namespace mok::tools {

namespace {

std::optional<int>* dim_field(LayerDims& dims, const std::string& flag) {
  return flag == "--hidden"         ? &dims.hidden
         : flag == "--intermediate" ? &dims.intermediate
         : flag == "--experts"      ? &dims.experts
         : flag == "--top-k"        ? &dims.top_k
         : flag == "--shared"       ? &dims.shared
                                    : nullptr;
}

}  // namespace

bool is_layer_dim_flag(const std::string& flag) {
  LayerDims probe;
  return dim_field(probe, flag) != nullptr;
}

void parse_layer_dim(LayerDims& dims, const std::string& who, const std::string& flag, const std::string& value) {
  std::optional<int>* field = dim_field(dims, flag);
  if (field == nullptr) throw Error(who + ": " + flag + " is not a layer dim");
  // Whole-string numbers: std::stoi would take "12abc" as 12.
  int v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size()) {
    throw Error(who + " " + flag + " " + value + ": expected an integer");
  }
  *field = v;
}

std::string layer_dims_usage() {
  return "  --hidden H --intermediate I --experts E --top-k K --shared S\n"
         "                         override the preset's dims (S: the shared FFN's width, 0: none)\n";
}

LayerConfig config_with_dims(const std::string& who, const std::string& preset, const LayerDims& dims, int world,
                             int tokens_per_rank, const std::vector<int>& per_rank, DType dtype) {
  LayerShape shape = find_shape(preset);
  if (dims.hidden) shape.hidden = *dims.hidden;
  if (dims.intermediate) shape.intermediate = *dims.intermediate;
  if (dims.experts) shape.num_experts = *dims.experts;
  if (dims.top_k) shape.top_k = *dims.top_k;
  if (dims.shared && *dims.shared < 0) throw Error(who + " --shared " + std::to_string(*dims.shared) + ": a width >= 0");
  if (dims.shared) shape.num_shared_experts = *dims.shared > 0 ? 1 : 0;
  LayerConfig config =
      per_rank.empty() ? make_config(shape, world, tokens_per_rank, dtype) : make_config(shape, per_rank, dtype);
  if (dims.shared && *dims.shared > 0) config.shared_intermediate = *dims.shared;
  validate(config);
  return config;
}

std::string describe_overrides(const LayerDims& dims) {
  std::string out;
  const auto add = [&](const char* name, const std::optional<int>& v) {
    if (v) out += std::string(out.empty() ? ", with " : ", ") + name + " " + std::to_string(*v);
  };
  add("hidden", dims.hidden);
  add("intermediate", dims.intermediate);
  add("experts", dims.experts);
  add("top-k", dims.top_k);
  add("shared", dims.shared);
  return out;
}

}  // namespace mok::tools
