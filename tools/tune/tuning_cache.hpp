// The tuning cache file, shared with python/mok/tune.py's TuningCache: the
// same path, the same format, the same lock, so that either tuner's entries
// serve the other and the Python front (mok/tuning_source.py) reads both.
//
// Format (version 1), as Python's json.dump(indent=1, sort_keys=True) lays it out:
//   {"entries": {"<TuneKey id>": {"options": {"minibatch_rows": 3072, ...},
//                                 "when": "2026-12-01T14:03:22", "speedup": 1.04, ...}},
//    "version": 1}
// Readers never lock: writers replace the file atomically (a temporary in the
// same directory, then rename), so a reader sees the old file or the new one.
// Writers serialize on flock() of "<path>.lock" -- the lock Python's fcntl.flock
// takes -- so concurrent tuners of either language never lose each other's
// entries. A missing file is an empty cache; an unreadable, corrupt or
// other-version file is ignored with a warning (a newer version's file is
// moved aside to "<path>.v<N>" before a store, never overwritten).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "tune/json_value.hpp"
#include "tune/option_set.hpp"
#include "tune/tune_key.hpp"

namespace mok::tune {

inline constexpr int kCacheVersion = 1;  // python/mok/tune.py's CACHE_VERSION

// $XDG_CACHE_HOME/mok/tuning.json, else ~/.cache/mok/tuning.json (Python's
// default_cache_path(); an empty XDG_CACHE_HOME counts as unset).
std::string default_cache_path();

struct CacheEntry {
  OptionSet options;  // the entry's tuning options (names this build does not know are left out)
  json::Value entry;  // the whole entry as stored: "options", "when", "speedup", ...
};

// Where warnings go ("mok: ignoring the tuning cache ..."): stderr by default,
// a test's collector in tests.
using WarningSink = std::function<void(const std::string&)>;
void warn_to_stderr(const std::string& message);

class TuningCache {
 public:
  explicit TuningCache(std::string path = default_cache_path(), WarningSink warn = warn_to_stderr);

  // The entry for `key`, or nothing (no file, no entry, or an ignored file or
  // entry, with a warning). Never throws for what the file holds.
  std::optional<CacheEntry> lookup(const TuneKey& key) const;

  // Adds or replaces `key`'s entry: {"options": options, "when": now (local
  // time, to the second), and every member of `facts`}; every other entry is
  // kept as it was. Throws mok::Error when the file cannot be written.
  void store(const TuneKey& key, const OptionSet& options, const json::Value& facts = json::Value::object()) const;

  const std::string& path() const { return path_; }

 private:
  // The file's JSON; nothing when it is absent (silently) or unreadable or
  // not JSON (with a warning).
  std::optional<json::Value> load() const;
  // The "entries" object of a version-1 cache; an empty one (with a warning)
  // for anything else.
  json::Value entries_of(const std::optional<json::Value>& data) const;

  std::string path_;
  WarningSink warn_;
};

}  // namespace mok::tune
