// The tuning cache file (tuning_cache.hpp): read, merge, write, with the
// lock and the atomic replace python/mok/tune.py uses, step for step.
#include "tune/tuning_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include "mok/error.hpp"

namespace mok::tune {
namespace {

std::string errno_text(int error) { return std::strerror(error); }

// The whole file, or the errno of the failure (ENOENT: absent).
int read_file(const std::string& path, std::string& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  out.clear();
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return error;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return 0;
}

// Writes all of `text` to `fd`; false (errno set) on failure.
bool write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// flock() on "<cache>.lock", held for a scope: the protocol of Python's
// TuningCache._locked (open(path + ".lock", "w"), fcntl.flock(LOCK_EX)).
// flock locks belong to the open file, so a Python writer and this one
// exclude each other whichever language they are in.
class LockFile {
 public:
  explicit LockFile(const std::string& path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd_ < 0) throw Error("cannot open the tuning cache's lock file " + path + ": " + errno_text(errno));
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        const int error = errno;
        ::close(fd_);
        throw Error("cannot lock " + path + ": " + errno_text(error));
      }
    }
  }
  ~LockFile() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  LockFile(const LockFile&) = delete;
  LockFile& operator=(const LockFile&) = delete;

 private:
  int fd_ = -1;
};

// Local time to the second, as Python's datetime.now().isoformat(timespec="seconds").
std::string now_iso() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &local);
  return buf;
}

// Replaces `path` with `text` atomically: a temporary in the same directory
// (named as Python's mkstemp(prefix=".tuning.", suffix=".json") names its own,
// mode 0600 like it), then rename(); the temporary is removed on failure.
void replace_file(const std::string& path, const std::string& text) {
  const std::filesystem::path target(path);
  std::string temp = (target.parent_path() / ".tuning.XXXXXX.json").string();
  const int fd = ::mkstemps(temp.data(), 5);
  if (fd < 0) throw Error("cannot create a temporary file beside " + path + ": " + errno_text(errno));
  // fsync before the rename: a crash just after it must not leave an empty file in the cache's place.
  const bool ok = write_all(fd, text) && ::fsync(fd) == 0;
  const int error = errno;
  ::close(fd);
  if (!ok || ::rename(temp.c_str(), path.c_str()) != 0) {
    const int failure = ok ? errno : error;
    ::unlink(temp.c_str());
    throw Error("cannot write the tuning cache " + path + ": " + errno_text(failure));
  }
}

// Python's `data.get("version") != CACHE_VERSION` is false for 1 and 1.0 alike.
bool is_current_version(const json::Value& data) {
  const json::Value* version = data.find("version");
  const std::optional<double> v = version != nullptr ? version->as_double() : std::nullopt;
  return v.has_value() && *v == kCacheVersion;
}

}  // namespace

std::string default_cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  std::filesystem::path root;
  if (xdg != nullptr && *xdg != '\0') {
    root = xdg;
  } else {
    const char* home = std::getenv("HOME");
    root = std::filesystem::path(home != nullptr && *home != '\0' ? home : "/") / ".cache";
  }
  return (root / "mok" / "tuning.json").string();
}

void warn_to_stderr(const std::string& message) { std::fprintf(stderr, "warning: %s\n", message.c_str()); }

TuningCache::TuningCache(std::string path, WarningSink warn) : path_(std::move(path)), warn_(std::move(warn)) {}

std::optional<json::Value> TuningCache::load() const {
  std::string text;
  const int error = read_file(path_, text);
  if (error == ENOENT) return std::nullopt;
  if (error != 0) {
    warn_("mok: ignoring the tuning cache " + path_ + ": " + errno_text(error));
    return std::nullopt;
  }
  json::ParseResult parsed = json::parse(text);
  if (!parsed.value) {
    warn_("mok: ignoring the tuning cache " + path_ + ": " + parsed.error);
    return std::nullopt;
  }
  return std::move(parsed.value);
}

json::Value TuningCache::entries_of(const std::optional<json::Value>& data) const {
  if (!data) return json::Value::object();
  const json::Value* entries = data->find("entries");
  if (!data->is_object() || !is_current_version(*data) || entries == nullptr || !entries->is_object()) {
    warn_("mok: ignoring the tuning cache " + path_ + ": not a version-" + std::to_string(kCacheVersion) +
          " mok tuning cache");
    return json::Value::object();
  }
  return *entries;
}

std::optional<CacheEntry> TuningCache::lookup(const TuneKey& key) const {
  const json::Value entries = entries_of(load());
  const json::Value* entry = entries.find(key.id());
  if (entry == nullptr) return std::nullopt;
  auto malformed = [&] {
    warn_("mok: ignoring a malformed entry of the tuning cache " + path_ + " for " + key.id());
    return std::nullopt;
  };
  const json::Value* options = entry->find("options");
  if (options == nullptr || !options->is_object()) return malformed();
  CacheEntry found{{}, *entry};
  for (const json::Member& m : options->members) {
    FusedForwardOptions probe;
    if (option_field(probe, m.key) == nullptr) continue;  // a newer mok's option, as tuning_source.py filters
    const std::optional<long long> value = m.value.as_integer();
    if (!value || *value < std::numeric_limits<int>::min() || *value > std::numeric_limits<int>::max()) {
      return malformed();
    }
    found.options[m.key] = static_cast<int>(*value);
  }
  return found;
}

void TuningCache::store(const TuneKey& key, const OptionSet& options, const json::Value& facts) const {
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) throw Error("cannot create the tuning cache's directory " + parent.string() + ": " + ec.message());
  const LockFile lock(path_ + ".lock");

  std::optional<json::Value> data = load();
  if (data && data->is_object()) {
    const json::Value* version = data->find("version");
    const std::optional<long long> newer = version != nullptr ? version->as_integer() : std::nullopt;
    if (newer && *newer > kCacheVersion) {
      // A newer mok's cache: keep it aside rather than drop its entries.
      const std::string aside = path_ + ".v" + std::to_string(*newer);
      if (::rename(path_.c_str(), aside.c_str()) != 0) {
        throw Error("cannot move the newer tuning cache " + path_ + " aside: " + errno_text(errno));
      }
      warn_("mok: the tuning cache " + path_ + " is from a newer version; moved to " + aside);
      data.reset();
    }
  }
  json::Value entries = entries_of(data);

  json::Value entry = json::Value::object();
  entry.set("options", to_json(options));
  entry.set("when", json::Value::string(now_iso()));
  for (const json::Member& fact : facts.members) entry.set(fact.key, fact.value);
  entries.set(key.id(), std::move(entry));

  json::Value document = json::Value::object();
  document.set("version", json::Value::integer(kCacheVersion));
  document.set("entries", std::move(entries));
  replace_file(path_, json::write(document));
}

}  // namespace mok::tune
