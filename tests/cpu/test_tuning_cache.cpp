// mok_cli tune's tuning cache (tools/tune/tuning_cache.hpp) against
// python/mok/tune.py's: the same key string for the same facts (expected
// strings produced by TuneKey(...).id()), the same file (entries Python wrote
// are read, and kept untouched by a store), the same tolerance of corrupt,
// stale and newer files, and the same lock (a writer holding flock on
// "<path>.lock", as Python's does, keeps a store out until it lets go).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mok/presets.hpp"
#include "tune/json_value.hpp"
#include "tune/tune_key.hpp"
#include "tune/tuning_cache.hpp"
#include "tuning_cache_fixtures.hpp"

namespace {

namespace fs = std::filesystem;
using mok::test_support::kCppFile;
using mok::test_support::kPythonFile;
using mok::tune::CacheEntry;
using mok::tune::OptionSet;
using mok::tune::TuneKey;
using mok::tune::TuningCache;
namespace json = mok::tune::json;

const char* const kSliceId = "NVIDIA H200|132|13.0|13000|7168|2048|32|8|2048|4096|1|bf16|forward";
const char* const kPythonOtherId = "NVIDIA H200|132|13.0|13000|4096|1536|16|8|0|8192|2|bf16|forward";

mok::tune::GpuFacts h200() { return {"NVIDIA H200", 132, "13.0", "13000"}; }

// The DeepSeek-V3 slice's key at 4096 tokens per rank (python -m mok.tune's
// defaults), for a world of `world` ranks (any number: a key, not a layer).
TuneKey slice_key(int world = 1) {
  TuneKey key = mok::tune::forward_key(h200(), mok::make_config(mok::find_shape("deepseek-v3-ep8-slice"), 1, 4096));
  key.world = world;
  return key;
}

// A fresh directory, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "mok_tuning_XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // Names starting ".tuning." (a store's temporaries, which must not outlive it).
  std::vector<std::string> temporaries() const {
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(path_)) {
      if (e.path().filename().string().rfind(".tuning.", 0) == 0) found.push_back(e.path().string());
    }
    return found;
  }

 private:
  fs::path path_;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A cache whose warnings are collected.
struct Collected {
  std::vector<std::string> warnings;
  TuningCache cache(const std::string& path) {
    return TuningCache(path, [this](const std::string& w) { warnings.push_back(w); });
  }
  bool warned(const std::string& part) const {
    for (const std::string& w : warnings) {
      if (w.find(part) != std::string::npos) return true;
    }
    return false;
  }
};

json::Value entries_of_file(const std::string& path) {
  const auto parsed = json::parse(read_text(path));
  if (!parsed.value) throw std::runtime_error("not JSON: " + parsed.error);
  EXPECT_EQ(parsed.value->find("version")->as_integer(), 1);
  return *parsed.value->find("entries");
}

TEST(TuningCacheKey, IsTheStringPythonsTuneKeyIdGives) {
  EXPECT_EQ(slice_key().id(), kSliceId);
  // Python: TuneKey("NVIDIA H100 80GB HBM3", 132, "12.8", "12080", 4096, 1536, 16, 8, 0,
  //                 tokens_bucket(3000), 2).id(); the key takes the largest rank's tokens.
  const mok::tune::GpuFacts h100{"NVIDIA H100 80GB HBM3", 132, mok::tune::cuda_version_text(12080), "12080"};
  EXPECT_EQ(mok::tune::forward_key(h100, mok::make_config(mok::find_shape("qwen3-235b-ep8-slice"), {3000, 1200})).id(),
            "NVIDIA H100 80GB HBM3|132|12.8|12080|4096|1536|16|8|0|4096|2|bf16|forward");
  EXPECT_EQ(mok::tune::cuda_version_text(13000), "13.0");
}

TEST(TuningCacheKey, TokensAreBucketedAsPythonBucketsThem) {
  // Python: [tokens_bucket(t) for t in (0, 1, 255, 256, 257, 4096, 5000, 65537)]
  const std::vector<int64_t> expected{256, 256, 256, 256, 512, 4096, 8192, 131072};
  const std::vector<int64_t> tokens{0, 1, 255, 256, 257, 4096, 5000, 65537};
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(mok::tune::tokens_bucket(tokens[i]), expected[i]);
}

TEST(TuningCachePath, FollowsXdgElseHomeAsPythonDoes) {
  const char* old_xdg = std::getenv("XDG_CACHE_HOME");
  const char* old_home = std::getenv("HOME");
  const std::optional<std::string> xdg = old_xdg ? std::optional<std::string>(old_xdg) : std::nullopt;
  const std::optional<std::string> home = old_home ? std::optional<std::string>(old_home) : std::nullopt;
  ::setenv("XDG_CACHE_HOME", "/x/cache", 1);
  EXPECT_EQ(mok::tune::default_cache_path(), "/x/cache/mok/tuning.json");
  ::setenv("XDG_CACHE_HOME", "", 1);  // empty counts as unset (Python's `or`)
  ::setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(mok::tune::default_cache_path(), "/home/someone/.cache/mok/tuning.json");
  if (xdg) ::setenv("XDG_CACHE_HOME", xdg->c_str(), 1); else ::unsetenv("XDG_CACHE_HOME");
  if (home) ::setenv("HOME", home->c_str(), 1); else ::unsetenv("HOME");
}

TEST(TuningCache, RoundTripKeepsOtherEntriesAndLeavesNoTemporary) {
  TempDir dir;
  Collected c;
  const TuningCache cache = c.cache(dir.file("sub/dir/tuning.json"));  // directories made as needed
  EXPECT_FALSE(cache.lookup(slice_key()));
  json::Value facts = json::Value::object();
  facts.set("speedup", json::Value::number(1.04));
  cache.store(slice_key(1), {{"minibatch_rows", 3072}}, facts);
  cache.store(slice_key(2), {{"ring_slots", 3}});
  const std::optional<CacheEntry> one = cache.lookup(slice_key(1));
  ASSERT_TRUE(one);
  EXPECT_EQ(one->options, (OptionSet{{"minibatch_rows", 3072}}));
  EXPECT_EQ(one->entry.find("speedup")->text, "1.04");
  EXPECT_EQ(one->entry.find("when")->text.size(), std::string("2026-12-01T14:03:22").size());
  ASSERT_TRUE(cache.lookup(slice_key(2)));
  EXPECT_EQ(cache.lookup(slice_key(2))->options, (OptionSet{{"ring_slots", 3}}));
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
  EXPECT_TRUE(fs::exists(dir.file("sub/dir/tuning.json.lock")));  // Python's lock file, beside the cache
  EXPECT_TRUE(dir.temporaries().empty());
}

TEST(TuningCache, WritesTheTextPythonsStoreWouldWrite) {
  TempDir dir;
  json::Value facts = json::Value::object();
  facts.set("speedup", json::Value::number(1.04));
  facts.set("tuning_seconds", json::Value::number(12.5));
  facts.set("tool", json::Value::string("mok_cli tune"));
  facts.set("when", json::Value::string("2026-12-03T10:00:00"));
  TuningCache(dir.file("tuning.json")).store(slice_key(), {{"minibatch_rows", 3072}, {"lookahead", 3}}, facts);
  EXPECT_EQ(read_text(dir.file("tuning.json")), kCppFile);
}

TEST(TuningCache, ReadsTheEntriesPythonWrote) {
  TempDir dir;
  write_text(dir.file("tuning.json"), kPythonFile);
  Collected c;
  const TuningCache cache = c.cache(dir.file("tuning.json"));
  const std::optional<CacheEntry> slice = cache.lookup(slice_key());
  ASSERT_TRUE(slice);
  EXPECT_EQ(slice->options, (OptionSet{{"comm_ctas_per_rank", 5}, {"minibatch_rows", 3072}}));
  EXPECT_EQ(slice->entry.find("speedup")->as_double(), 1.0434782608695652);
  EXPECT_EQ(slice->entry.find("tool")->text, "python -m mok.tune");
  TuneKey other = slice_key(2);
  other.hidden = 4096, other.intermediate = 1536, other.experts = 16, other.shared = 0, other.tokens_bucket = 8192;
  ASSERT_EQ(other.id(), kPythonOtherId);
  ASSERT_TRUE(cache.lookup(other));
  EXPECT_TRUE(cache.lookup(other)->options.empty());  // {}: the defaults were best
  EXPECT_TRUE(c.warnings.empty());
}

TEST(TuningCache, AStoreKeepsEveryOtherEntryAsItWas) {
  TempDir dir;
  const std::string path = dir.file("tuning.json");
  write_text(path, kPythonFile);
  const json::Value before = entries_of_file(path);
  TuningCache(path).store(slice_key(4), {{"ring_slots", 6}});
  TuningCache(path).store(slice_key(), {{"lookahead", 1}});  // replaces that key's entry only
  const json::Value after = entries_of_file(path);
  ASSERT_EQ(after.members.size(), 3u);
  EXPECT_EQ(json::write_line(*after.find(kPythonOtherId)), json::write_line(*before.find(kPythonOtherId)));
  EXPECT_EQ(json::write_line(*after.find(kSliceId)->find("options")), R"({"lookahead": 1})");
  EXPECT_EQ(after.find(kSliceId)->find("speedup"), nullptr);  // a replaced entry keeps nothing of the old one
  EXPECT_EQ(json::write_line(*after.find(slice_key(4).id())->find("options")), R"({"ring_slots": 6})");
}

TEST(TuningCache, ACorruptOrStaleFileIsIgnoredWithAWarningThenOverwrittenCleanly) {
  const std::string contents[] = {"{not json", R"({"version": 0, "entries": {}})", "[]",
                                  std::string("\xff\xfe\x00" "bad", 6), R"({"version": "1", "entries": {}})",
                                  R"({"version": 1, "entries": []})", R"({"version": 1})", ""};
  for (const std::string& content : contents) {
    TempDir dir;
    const std::string path = dir.file("tuning.json");
    write_text(path, content);
    Collected c;
    const TuningCache cache = c.cache(path);
    EXPECT_FALSE(cache.lookup(slice_key())) << content;
    EXPECT_TRUE(c.warned("mok: ignoring the tuning cache " + path)) << content;
    c.warnings.clear();
    cache.store(slice_key(), {{"lookahead", 1}});
    EXPECT_TRUE(c.warned("mok: ignoring the tuning cache")) << content;
    c.warnings.clear();
    ASSERT_TRUE(cache.lookup(slice_key())) << content;
    EXPECT_EQ(cache.lookup(slice_key())->options, (OptionSet{{"lookahead", 1}}));
    EXPECT_EQ(entries_of_file(path).members.size(), 1u);
    EXPECT_TRUE(c.warnings.empty()) << content;
  }
}

TEST(TuningCache, AnUnreadableFileIsIgnoredWithAWarning) {
  TempDir dir;
  fs::create_directory(dir.file("tuning.json"));  // a directory where the file should be: read() fails
  Collected c;
  EXPECT_FALSE(c.cache(dir.file("tuning.json")).lookup(slice_key()));
  EXPECT_TRUE(c.warned("mok: ignoring the tuning cache"));
}

TEST(TuningCache, ANewerVersionsFileIsMovedAsideNotOverwritten) {
  TempDir dir;
  const std::string path = dir.file("tuning.json");
  const std::string newer = R"({"version": 2, "entries": {"theirs": {"options": {}}}})";
  write_text(path, newer);
  Collected c;
  const TuningCache cache = c.cache(path);
  cache.store(slice_key(), {{"lookahead", 1}});
  EXPECT_TRUE(c.warned("is from a newer version; moved to " + path + ".v2"));
  EXPECT_EQ(read_text(path + ".v2"), newer);
  ASSERT_TRUE(cache.lookup(slice_key()));
}

TEST(TuningCache, AMalformedEntryIsIgnoredWithAWarning) {
  const std::string entries[] = {"3", R"({"options": 3})", R"({"when": "x"})", R"({"options": {"ring_slots": "3"}})",
                                 R"({"options": {"ring_slots": 3.5}})", R"({"options": {"ring_slots": 99999999999}})"};
  for (const std::string& entry : entries) {
    TempDir dir;
    write_text(dir.file("tuning.json"), std::string(R"({"version": 1, "entries": {")") + kSliceId + "\": " + entry + "}}");
    Collected c;
    EXPECT_FALSE(c.cache(dir.file("tuning.json")).lookup(slice_key())) << entry;
    EXPECT_TRUE(c.warned("mok: ignoring a malformed entry of the tuning cache")) << entry;
    EXPECT_TRUE(c.warned(kSliceId)) << entry;
  }
}

TEST(TuningCache, OptionsThisBuildDoesNotKnowAreLeftOut) {
  TempDir dir;
  write_text(dir.file("tuning.json"), std::string(R"({"version": 1.0, "entries": {")") + kSliceId +
                                          R"(": {"options": {"ring_slots": 3, "some_future_option": 7}}}})");
  Collected c;
  const auto entry = c.cache(dir.file("tuning.json")).lookup(slice_key());
  ASSERT_TRUE(entry);  // version 1.0 is version 1 to Python too
  EXPECT_EQ(entry->options, (OptionSet{{"ring_slots", 3}}));
  EXPECT_TRUE(c.warnings.empty());
}

// Python's test_concurrent_writers_leave_a_valid_file_with_every_entry, with
// processes of this build.
TEST(TuningCache, ConcurrentWritersLeaveAValidFileWithEveryEntry) {
  TempDir dir;
  const std::string path = dir.file("tuning.json");
  std::vector<pid_t> children;
  for (int world = 1; world <= 6; ++world) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        const TuningCache cache(path, [](const std::string&) {});
        for (int i = 0; i < 20; ++i) cache.store(slice_key(world), {{"minibatch_rows", 1024 + i}});
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(0);
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  const json::Value entries = entries_of_file(path);
  EXPECT_EQ(entries.members.size(), 6u);
  for (int world = 1; world <= 6; ++world) {
    const json::Value* entry = entries.find(slice_key(world).id());
    ASSERT_NE(entry, nullptr) << world;
    EXPECT_EQ(json::write_line(*entry->find("options")), R"({"minibatch_rows": 1043})");
  }
  EXPECT_TRUE(dir.temporaries().empty());
}

// A writer that holds the lock as Python's TuningCache._locked takes it
// (open(path + ".lock", "w"), flock LOCK_EX) keeps a store waiting, and the
// store then merges into what that writer wrote.
TEST(TuningCache, AStoreWaitsForAWriterHoldingPythonsLock) {
  TempDir dir;
  const std::string path = dir.file("tuning.json");
  const int lock = ::open((path + ".lock").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(::flock(lock, LOCK_EX), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      TuningCache(path, [](const std::string&) {}).store(slice_key(3), {{"ring_slots", 3}});
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, WNOHANG), 0) << "the store did not wait for the lock";
  EXPECT_FALSE(fs::exists(path));
  write_text(path, kPythonFile);  // the lock holder's own store
  ASSERT_EQ(::flock(lock, LOCK_UN), 0);
  ::close(lock);
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const json::Value entries = entries_of_file(path);
  EXPECT_EQ(entries.members.size(), 3u);  // the holder's two and the waiting store's one
  EXPECT_NE(entries.find(slice_key(3).id()), nullptr);
}

}  // namespace
