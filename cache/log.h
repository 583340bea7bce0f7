// Minimal leveled logging to stderr, set by KILN_LOG (error|warn|info|debug; default warn).
// kiln logs rarely: what it could not store, a fallback taken, what a tune chose.
#pragma once

#include <string_view>

namespace kiln::log {

enum class Level { error = 0, warn = 1, info = 2, debug = 3 };

Level level();
void set_level(Level level);
// Parses "error" | "warn" | "info" | "debug" (or 0..3); unknown text keeps the default.
Level parse_level(std::string_view text, Level fallback);

void write(Level level, std::string_view message);
inline void error(std::string_view m) {
  write(Level::error, m);
}
inline void warn(std::string_view m) {
  write(Level::warn, m);
}
inline void info(std::string_view m) {
  write(Level::info, m);
}
inline void debug(std::string_view m) {
  write(Level::debug, m);
}

// Logs `message` at warn level the first time `key` is seen in this process, so a condition
// that repeats on every call (an unwritable cache folder) is said once.
void warn_once(std::string_view key, std::string_view message);

}  // namespace kiln::log
