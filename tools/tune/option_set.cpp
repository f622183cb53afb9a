// Tuning option sets by name (option_set.hpp).
#include "tune/option_set.hpp"

#include "mok/error.hpp"

namespace mok::tune {

int* option_field(FusedForwardOptions& options, std::string_view name) {
#define MOK_OPTION_FIELD(field) \
  if (name == #field) return &options.field;
  MOK_FOR_EACH_TUNING_OPTION(MOK_OPTION_FIELD)
#undef MOK_OPTION_FIELD
  return nullptr;
}

FusedForwardOptions apply(FusedForwardOptions base, const OptionSet& set) {
  for (const auto& [name, value] : set) {
    int* field = option_field(base, name);
    if (field == nullptr) throw Error("'" + name + "' is not a tuning option of the fused forward");
    *field = value;
  }
  return base;
}

json::Value to_json(const OptionSet& set) {
  json::Value object = json::Value::object();
  for (const auto& [name, value] : set) object.set(name, json::Value::integer(value));
  return object;
}

std::string describe(const OptionSet& set) { return json::write_line(to_json(set)); }

}  // namespace mok::tune
