// The tuning cache's JSON (tools/tune/json_value.hpp): it must read what
// Python's json module writes, lay a document out byte for byte as
// json.dump(indent=1, sort_keys=True) does (so the two tuners' files differ
// only in content), keep other writers' numbers digit for digit, and refuse
// malformed text with a message rather than crash. Expected texts below were
// produced by Python 3.11's json and repr.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>

#include "tune/json_value.hpp"
#include "tuning_cache_fixtures.hpp"

namespace {

using mok::test_support::kPythonFile;
using mok::tune::json::parse;
using mok::tune::json::Value;
using mok::tune::json::write;
using mok::tune::json::write_line;

TEST(TuningJson, APythonWrittenFileIsReadAndWrittenBackByteForByte) {
  const auto parsed = parse(kPythonFile);
  ASSERT_TRUE(parsed.value) << parsed.error;
  EXPECT_EQ(write(*parsed.value), kPythonFile);
}

TEST(TuningJson, StringsAreDecodedToUtf8AndEscapedBackAsPythonDoes) {
  const auto parsed = parse(kPythonFile);
  ASSERT_TRUE(parsed.value);
  const Value* entry =
      parsed.value->find("entries")->find("NVIDIA H200|132|13.0|13000|4096|1536|16|8|0|8192|2|bf16|forward");
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->find("note")->text, "caf\xC3\xA9 \xF0\x9F\x98\x80 \"q\"");
  EXPECT_EQ(write_line(Value::string("tab\there\x7f\x01/")), R"("tab\there\u007f\u0001/")");
}

TEST(TuningJson, NumbersKeepTheirTextAndNewOnesAreWrittenAsPythonsRepr) {
  const auto parsed = parse(R"([1.0434782608695652, 1e400, -0.0, 12, NaN, -Infinity])");
  ASSERT_TRUE(parsed.value);
  EXPECT_EQ(write_line(*parsed.value), "[1.0434782608695652, 1e400, -0.0, 12, NaN, -Infinity]");
  EXPECT_EQ(parsed.value->items[3].as_integer(), 12);
  EXPECT_FALSE(parsed.value->items[0].as_integer());
  EXPECT_TRUE(std::isinf(*parsed.value->items[1].as_double()));
  // repr() of each, from Python.
  const std::pair<double, const char*> reprs[] = {
      {1.04, "1.04"}, {1.0, "1.0"}, {100.0, "100.0"}, {1e16, "1e+16"}, {1.5e-5, "1.5e-05"}, {0.0001, "0.0001"},
      {123456789.123, "123456789.123"}, {1e22, "1e+22"}, {-0.0, "-0.0"}, {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"}, {0.1 + 0.2, "0.30000000000000004"},
      {1 / 1.006, "0.9940357852882704"}, {12345678901234567.0, "1.2345678901234568e+16"},
      {1e15, "1000000000000000.0"}, {0.00012, "0.00012"}};
  for (const auto& [value, text] : reprs) EXPECT_EQ(Value::number(value).text, text) << text;
}

TEST(TuningJson, MalformedTextIsRefusedWithAMessage) {
  const char* const bad[] = {
      "",  "{not json", "{\"a\": 1,}", "[1 2]", "{\"a\" 1}", "01", "1.", "-", "\"unterminated",
      "\"bad \\x escape\"", "\"raw\ncontrol\"", "\xff\xfe\x00" "bad", "\"\xc3\x28\"", "\"\xed\xa0\x80\"",
      "{} extra", "tru", "\"\\u12G4\"", "[-Infinit]", "\xEF\xBB\xBF{}"};
  for (const char* text : bad) {
    const auto parsed = parse(std::string_view(text, std::char_traits<char>::length(text)));
    EXPECT_FALSE(parsed.value) << text;
    EXPECT_NE(parsed.error, "") << text;
  }
  // NUL bytes inside the text, which a C string cannot show.
  EXPECT_FALSE(parse(std::string_view("\xff\xfe\x00" "bad", 6)).value);
}

TEST(TuningJson, DeepNestingIsRefusedNotAStackOverflow) {
  EXPECT_FALSE(parse(std::string(100000, '[')).value);
  EXPECT_TRUE(parse(std::string(60, '[') + std::string(60, ']')).value);
}

TEST(TuningJson, ARepeatedKeyKeepsItsLastValueAsPythonDoes) {
  const auto parsed = parse(R"({"a": 1, "b": 2, "a": 3})");
  ASSERT_TRUE(parsed.value);
  EXPECT_EQ(parsed.value->members.size(), 2u);
  EXPECT_EQ(parsed.value->find("a")->as_integer(), 3);
}

TEST(TuningJson, LoneSurrogateEscapesSurviveARewrite) {
  const auto parsed = parse(R"(["\ud800x", "\udc00"])");
  ASSERT_TRUE(parsed.value);
  EXPECT_EQ(write_line(*parsed.value), R"(["\ud800x", "\udc00"])");
}

TEST(TuningJson, EmptyContainersAndOneLineLayout) {
  Value v = Value::object();
  v.set("z", Value::object());
  v.set("a", Value::integer(-7));
  v.set("m", Value::null());
  EXPECT_EQ(write(v), "{\n \"a\": -7,\n \"m\": null,\n \"z\": {}\n}");
  EXPECT_EQ(write_line(v), R"({"a": -7, "m": null, "z": {}})");
}

}  // namespace
