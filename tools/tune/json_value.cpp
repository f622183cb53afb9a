// The tuning cache's JSON reader and writer (see json_value.hpp for why they
// are hand-written and what they promise).
#include "tune/json_value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <system_error>
#include <utility>

namespace mok::tune::json {
namespace {

constexpr int kMaxDepth = 64;

// Appends code point `cp` as UTF-8. Lone surrogates (which Python's json.loads
// accepts from \uD800-style escapes) get the 3-byte form, so that the writer
// can escape them back unchanged.
void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Length of the well-formed UTF-8 sequence at s[0..] (strict, as Python's
// bytes.decode("utf-8"): no overlong forms, no surrogates, nothing past
// U+10FFFF), or 0 when it is not one.
size_t utf8_sequence_length(std::string_view s) {
  auto byte = [&](size_t i) { return i < s.size() ? static_cast<unsigned char>(s[i]) : 0u; };
  auto cont = [&](size_t i, unsigned lo = 0x80, unsigned hi = 0xBF) { return byte(i) >= lo && byte(i) <= hi; };
  const unsigned b0 = byte(0);
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(1) ? 2 : 0;
  if (b0 == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 0;
  if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) return cont(1) && cont(2) ? 3 : 0;
  if (b0 == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;
  if (b0 == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (b0 >= 0xF1 && b0 <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (b0 == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  ParseResult run() {
    Value value;
    skip_space();
    if (parse_value(value, 0)) {
      skip_space();
      if (pos_ == text_.size()) return {std::move(value), ""};
      fail("extra data after the document");
    }
    return {std::nullopt, error_};
  }

 private:
  bool fail(const std::string& what) {
    if (error_.empty()) {
      size_t line = 1, column = 1;
      for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
        if (text_[i] == '\n') {
          ++line;
          column = 1;
        } else {
          ++column;
        }
      }
      error_ = what + " (line " + std::to_string(line) + ", column " + std::to_string(column) + ")";
    }
    return false;
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_space() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++pos_;
  }

  bool consume(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  bool parse_value(Value& out, int depth) {
    if (depth > kMaxDepth) return fail("nested deeper than " + std::to_string(kMaxDepth));
    const char c = peek();
    if (c == '{') return parse_object(out, depth);
    if (c == '[') return parse_array(out, depth);
    if (c == '"') {
      out.kind = Value::Kind::kString;
      return parse_string(out.text);
    }
    for (const bool b : {true, false}) {
      if (consume(b ? "true" : "false")) {
        out.kind = Value::Kind::kBool;
        out.boolean = b;
        return true;
      }
    }
    if (consume("null")) {
      out.kind = Value::Kind::kNull;
      return true;
    }
    return parse_number(out);
  }

  bool parse_object(Value& out, int depth) {
    out = Value::object();
    ++pos_;  // '{'
    skip_space();
    if (consume("}")) return true;
    for (;;) {
      if (peek() != '"') return fail("expected a member name in double quotes");
      std::string key;
      if (!parse_string(key)) return false;
      skip_space();
      if (!consume(":")) return fail("expected ':'");
      skip_space();
      Value value;
      if (!parse_value(value, depth + 1)) return false;
      out.set(key, std::move(value));
      skip_space();
      if (consume("}")) return true;
      if (!consume(",")) return fail("expected ',' or '}'");
      skip_space();
    }
  }

  bool parse_array(Value& out, int depth) {
    out.kind = Value::Kind::kArray;
    ++pos_;  // '['
    skip_space();
    if (consume("]")) return true;
    for (;;) {
      Value item;
      if (!parse_value(item, depth + 1)) return false;
      out.items.push_back(std::move(item));
      skip_space();
      if (consume("]")) return true;
      if (!consume(",")) return fail("expected ',' or ']'");
      skip_space();
    }
  }

  bool parse_hex4(uint32_t& value) {
    if (pos_ + 4 > text_.size()) return fail("truncated \\u escape");
    value = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      uint32_t digit;
      if (h >= '0' && h <= '9') digit = static_cast<uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f') digit = static_cast<uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') digit = static_cast<uint32_t>(h - 'A' + 10);
      else return fail("invalid \\u escape");
      value = value * 16 + digit;
    }
    return true;
  }

  bool parse_string(std::string& out) {
    ++pos_;  // opening quote
    out.clear();
    for (;;) {
      if (at_end()) return fail("unterminated string");
      const auto c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20) return fail("control character in a string");
      if (c >= 0x80) {
        const size_t n = utf8_sequence_length(text_.substr(pos_));
        if (n == 0) return fail("invalid UTF-8");
        out.append(text_.substr(pos_, n));
        pos_ += n;
        continue;
      }
      ++pos_;
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      if (at_end()) return fail("unterminated string");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = 0;
          if (!parse_hex4(cp)) return false;
          // A high surrogate followed by a low one is one code point;
          // anything else is kept as it came (as Python does).
          if (cp >= 0xD800 && cp <= 0xDBFF && text_.substr(pos_, 2) == "\\u") {
            const size_t save = pos_;
            pos_ += 2;
            uint32_t low = 0;
            if (!parse_hex4(low)) return false;
            if (low >= 0xDC00 && low <= 0xDFFF) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else {
              pos_ = save;
            }
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --pos_;
          return fail("invalid escape");
      }
    }
  }

  bool parse_number(Value& out) {
    const size_t start = pos_;
    if (consume("NaN") || consume("Infinity") || consume("-Infinity")) {
      out.kind = Value::Kind::kNumber;
      out.text = std::string(text_.substr(start, pos_ - start));
      return true;
    }
    auto digits = [&] {
      const size_t from = pos_;
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
      return pos_ - from;
    };
    consume("-");
    if (consume("0")) {
      // a leading zero stands alone
    } else if (peek() >= '1' && peek() <= '9') {
      digits();
    } else {
      pos_ = start;
      return fail("expected a value");
    }
    if (consume(".") && digits() == 0) return fail("expected digits after '.'");
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (digits() == 0) return fail("expected digits in the exponent");
    }
    out.kind = Value::Kind::kNumber;
    out.text = std::string(text_.substr(start, pos_ - start));
    return true;
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::string error_;
};

// Decodes the UTF-8 at s[i..] (lenient: the 3-byte surrogates the parser
// keeps are taken too); an invalid byte reads as U+FFFD.
uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  auto cont = [&](size_t k) { return i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80; };
  auto bits = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F); };
  uint32_t cp = 0xFFFD;
  size_t n = 1;
  if (b0 < 0x80) {
    cp = b0;
  } else if (b0 >= 0xC2 && b0 <= 0xDF && cont(1)) {
    cp = ((b0 & 0x1Fu) << 6) | bits(1);
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF && cont(1) && cont(2)) {
    cp = ((b0 & 0x0Fu) << 12) | (bits(1) << 6) | bits(2);
    n = 3;
    if (cp < 0x800) cp = 0xFFFD;
  } else if (b0 >= 0xF0 && b0 <= 0xF4 && cont(1) && cont(2) && cont(3)) {
    cp = ((b0 & 0x07u) << 18) | (bits(1) << 12) | (bits(2) << 6) | bits(3);
    n = 4;
    if (cp < 0x10000 || cp > 0x10FFFF) cp = 0xFFFD;
  }
  i += n;
  return cp;
}

void append_escape(std::string& out, uint32_t unit) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(unit));
  out += buf;
}

// A JSON string as Python's json.dumps(ensure_ascii=True) writes it.
void write_string(std::string& out, std::string_view s) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      case '\b': out += "\\b"; ++i; continue;
      case '\f': out += "\\f"; ++i; continue;
      default: break;
    }
    const uint32_t cp = next_code_point(s, i);
    if (cp >= 0x10000) {
      append_escape(out, 0xD800 + ((cp - 0x10000) >> 10));
      append_escape(out, 0xDC00 + ((cp - 0x10000) & 0x3FF));
    } else {
      append_escape(out, cp);
    }
  }
  out += '"';
}

std::vector<const Member*> sorted_members(const Value& value) {
  std::vector<const Member*> sorted;
  for (const Member& m : value.members) sorted.push_back(&m);
  std::sort(sorted.begin(), sorted.end(), [](const Member* a, const Member* b) { return a->key < b->key; });
  return sorted;
}

// indent < 0: one line (json.dumps' default separators); else the layout
// of indent=1 at nesting level `indent`.
void write_value(std::string& out, const Value& value, int indent) {
  switch (value.kind) {
    case Value::Kind::kNull: out += "null"; return;
    case Value::Kind::kBool: out += value.boolean ? "true" : "false"; return;
    case Value::Kind::kNumber: out += value.text; return;
    case Value::Kind::kString: write_string(out, value.text); return;
    case Value::Kind::kArray:
    case Value::Kind::kObject: break;
  }
  const bool object = value.kind == Value::Kind::kObject;
  const size_t count = object ? value.members.size() : value.items.size();
  if (count == 0) {
    out += object ? "{}" : "[]";
    return;
  }
  const std::vector<const Member*> members = object ? sorted_members(value) : std::vector<const Member*>{};
  out += object ? '{' : '[';
  for (size_t i = 0; i < count; ++i) {
    if (indent >= 0) {
      out += i == 0 ? "\n" : ",\n";
      out.append(static_cast<size_t>(indent + 1), ' ');
    } else if (i > 0) {
      out += ", ";
    }
    if (object) {
      write_string(out, members[i]->key);
      out += ": ";
    }
    write_value(out, object ? members[i]->value : value.items[i], indent >= 0 ? indent + 1 : -1);
  }
  if (indent >= 0) {
    out += '\n';
    out.append(static_cast<size_t>(indent), ' ');
  }
  out += object ? '}' : ']';
}

}  // namespace

Value Value::string(std::string s) {
  Value v;
  v.kind = Kind::kString;
  v.text = std::move(s);
  return v;
}

Value Value::integer(long long value) {
  Value v;
  v.kind = Kind::kNumber;
  v.text = std::to_string(value);
  return v;
}

// Python's repr of a float: the shortest digits that read back the same,
// fixed notation for decimal exponents in [-4, 16), else d.ddde+XX.
Value Value::number(double value) {
  Value v;
  v.kind = Kind::kNumber;
  if (std::isnan(value)) {
    v.text = "NaN";
    return v;
  }
  if (std::isinf(value)) {
    v.text = value > 0 ? "Infinity" : "-Infinity";
    return v;
  }
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  const std::string sci(buf, result.ptr);  // [-]d[.ddd]e(+|-)XX
  const size_t e = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i) {
    if (sci[i] != '.') digits += sci[i];
  }
  const int exponent = std::atoi(sci.c_str() + e + 1);
  std::string text = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      text += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else {
      const size_t whole = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= whole) {
        text += digits + std::string(whole - digits.size(), '0') + ".0";
      } else {
        text += digits.substr(0, whole) + "." + digits.substr(whole);
      }
    }
  } else {
    text += digits.substr(0, 1);
    if (digits.size() > 1) text += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', exponent < 0 ? -exponent : exponent);
    text += exp;
  }
  v.text = text;
  return v;
}

Value Value::object() {
  Value v;
  v.kind = Kind::kObject;
  return v;
}

const Value* Value::find(std::string_view key) const {
  if (kind != Kind::kObject) return nullptr;
  for (const Member& m : members) {
    if (m.key == key) return &m.value;
  }
  return nullptr;
}

Value* Value::find(std::string_view key) {
  return const_cast<Value*>(static_cast<const Value&>(*this).find(key));
}

Value& Value::set(std::string_view key, Value value) {
  if (Value* existing = find(key)) {
    *existing = std::move(value);
    return *existing;
  }
  members.push_back({std::string(key), std::move(value)});
  return members.back().value;
}

std::optional<long long> Value::as_integer() const {
  if (kind != Kind::kNumber || text.find_first_of(".eEIN") != std::string::npos) return std::nullopt;
  long long v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<double> Value::as_double() const {
  if (kind != Kind::kNumber) return std::nullopt;
  if (text == "NaN") return std::nan("");
  if (text == "Infinity") return HUGE_VAL;
  if (text == "-Infinity") return -HUGE_VAL;
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  // Out of range: strtod's overflow to +-inf and underflow to 0, as Python's float().
  if (ec == std::errc::result_out_of_range) return std::strtod(text.c_str(), nullptr);
  if (ec != std::errc()) return std::nullopt;
  return v;
}

ParseResult parse(std::string_view text) { return Parser(text).run(); }

std::string write(const Value& value) {
  std::string out;
  write_value(out, value, 0);
  return out;
}

std::string write_line(const Value& value) {
  std::string out;
  write_value(out, value, -1);
  return out;
}

}  // namespace mok::tune::json
