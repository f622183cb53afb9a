// The JSON of the tuning cache: a value tree, a reader that refuses
// malformed text with a message (never a crash), and a writer that lays a
// tree out as Python's json.dump(indent=1, sort_keys=True) does.
//
// Hand-written rather than a library: the cache is one small flat file, the
// device machines have no package manager, and mok_cli must build there.
// The cache is shared with python/mok/tune.py, so the reader takes what
// Python's json module writes (NaN and Infinity included) and a rewrite
// keeps every entry it did not touch as it was: numbers keep the text they
// were written with, so no digit of another writer's entry changes.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mok::tune::json {

struct Member;

struct Value {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;            // kNumber: the literal as written; kString: the string, UTF-8
  std::vector<Value> items;    // kArray
  std::vector<Member> members; // kObject, in the order read or set (the writer sorts)

  static Value null() { return {}; }
  static Value string(std::string s);
  static Value integer(long long v);
  static Value number(double v);  // the shortest text that reads back as v (Python's repr)
  static Value object();

  bool is_object() const { return kind == Kind::kObject; }
  // kObject: the member named `key`, or null.
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  // kObject: sets `key` (replacing a member of that name) and returns it.
  Value& set(std::string_view key, Value value);
  // kNumber written as an integer (no fraction, no exponent) that fits a long long.
  std::optional<long long> as_integer() const;
  // kNumber: its value (NaN and +-Infinity included).
  std::optional<double> as_double() const;
};

struct Member {
  std::string key;
  Value value;
};

struct ParseResult {
  std::optional<Value> value;  // absent: `error` says what is wrong and where
  std::string error;
};

// Reads one JSON document: RFC 8259 plus Python's NaN, Infinity and
// -Infinity. Refuses invalid UTF-8, control characters in strings, trailing
// text and nesting deeper than 64 (so a hostile file cannot exhaust the stack).
// A repeated key keeps its last value, as Python's json.loads does.
ParseResult parse(std::string_view text);

// The text Python's json.dumps(value, indent=1, sort_keys=True) gives:
// members sorted by key, non-ASCII characters escaped as \uXXXX, no final newline.
std::string write(const Value& value);

// One line, as json.dumps(value, sort_keys=True): {"a": 1, "b": [2, 3]}.
std::string write_line(const Value& value);

}  // namespace mok::tune::json
