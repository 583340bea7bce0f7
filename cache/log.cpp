#include "cache/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

namespace kiln::log {
namespace {

std::atomic<int>& current() {
  static std::atomic<int> value{[] {
    const char* env = std::getenv("KILN_LOG");
    return static_cast<int>(parse_level(env ? env : "", Level::warn));
  }()};
  return value;
}

const char* label(Level level) {
  switch (level) {
    case Level::error:
      return "error";
    case Level::warn:
      return "warning";
    case Level::info:
      return "info";
    case Level::debug:
      return "debug";
  }
  return "?";
}

}  // namespace

Level level() {
  return static_cast<Level>(current().load(std::memory_order_relaxed));
}
void set_level(Level value) {
  current().store(static_cast<int>(value));
}

Level parse_level(std::string_view text, Level fallback) {
  if (text == "error" || text == "0") return Level::error;
  if (text == "warn" || text == "warning" || text == "1") return Level::warn;
  if (text == "info" || text == "2") return Level::info;
  if (text == "debug" || text == "3") return Level::debug;
  return fallback;
}

void write(Level at, std::string_view message) {
  if (static_cast<int>(at) > static_cast<int>(level())) return;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  std::fprintf(stderr, "[kiln %s] %.*s\n", label(at), static_cast<int>(message.size()),
               message.data());
}

void warn_once(std::string_view key, std::string_view message) {
  static std::mutex mutex;
  static std::set<std::string, std::less<>> seen;
  {
    std::lock_guard lock(mutex);
    if (!seen.emplace(key).second) return;
  }
  write(Level::warn, message);
}

}  // namespace kiln::log
