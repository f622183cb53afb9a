// Tuning cache files as each tuner writes them, shared by the CPU tests of
// the cache and its JSON. python/tests/test_tune.py holds kCppFile too (a
// file mok_cli tune wrote must be read by the Python front): change both.
#pragma once

namespace mok::test_support {

// A file python -m mok.tune's TuningCache.store wrote (Python 3.11): two
// entries, one with facts of every JSON kind, a non-ASCII string and a
// character outside the BMP.
inline constexpr const char* kPythonFile = R"({
 "entries": {
  "NVIDIA H200|132|13.0|13000|4096|1536|16|8|0|8192|2|bf16|forward": {
   "extra": {
    "nested": [
     1,
     2.5,
     null,
     true
    ]
   },
   "note": "caf\u00e9 \ud83d\ude00 \"q\"",
   "options": {},
   "speedup": 1.0,
   "tuning_seconds": 30.2,
   "when": "2026-12-02T09:00:00"
  },
  "NVIDIA H200|132|13.0|13000|7168|2048|32|8|2048|4096|1|bf16|forward": {
   "options": {
    "comm_ctas_per_rank": 5,
    "minibatch_rows": 3072
   },
   "speedup": 1.0434782608695652,
   "tool": "python -m mok.tune",
   "tuning_seconds": 61.83172,
   "when": "2026-12-01T14:03:22"
  }
 },
 "version": 1
})";

// What mok::tune::TuningCache::store writes into an empty directory for the
// DeepSeek-V3 slice's key, options {lookahead 3, minibatch_rows 3072} and the
// facts mok_cli tune adds (with "when" given, so that the text is fixed).
inline constexpr const char* kCppFile = R"({
 "entries": {
  "NVIDIA H200|132|13.0|13000|7168|2048|32|8|2048|4096|1|bf16|forward": {
   "options": {
    "lookahead": 3,
    "minibatch_rows": 3072
   },
   "speedup": 1.04,
   "tool": "mok_cli tune",
   "tuning_seconds": 12.5,
   "when": "2026-12-03T10:00:00"
  }
 },
 "version": 1
})";

}  // namespace mok::test_support
