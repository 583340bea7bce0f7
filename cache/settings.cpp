#include "cache/settings.h"

#include <array>
#include <cstdlib>
#include <string>
#include <system_error>

#include "cache/error.h"

namespace kiln {
namespace {

constexpr std::array<CacheMode, 4> kModes = {CacheMode::rw, CacheMode::ro, CacheMode::off,
                                             CacheMode::strict};

// An unset and an empty variable mean the same: "not given".
std::string_view env(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string_view(value) : std::string_view();
}

}  // namespace

std::string_view cache_mode_name(CacheMode mode) {
  switch (mode) {
    case CacheMode::rw:
      return "rw";
    case CacheMode::ro:
      return "ro";
    case CacheMode::off:
      return "off";
    case CacheMode::strict:
      return "strict";
  }
  return "?";
}

std::optional<CacheMode> parse_cache_mode(std::string_view text) {
  for (CacheMode mode : kModes) {
    if (text == cache_mode_name(mode)) return mode;
  }
  return std::nullopt;
}

std::filesystem::path default_cache_dir() {
  if (auto dir = env("KILN_CACHE_DIR"); !dir.empty()) return std::filesystem::path(dir);
  // The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
  if (auto xdg = env("XDG_CACHE_HOME"); !xdg.empty() && xdg.front() == '/') {
    return std::filesystem::path(xdg) / "kiln";
  }
  if (auto home = env("HOME"); !home.empty()) {
    return std::filesystem::path(home) / ".cache" / "kiln";
  }
  // Made absolute now so that a later chdir does not move the cache.
  std::error_code ec;
  auto here = std::filesystem::current_path(ec);
  return ec ? std::filesystem::path(".kiln-cache") : here / ".kiln-cache";
}

CacheMode default_cache_mode() {
  auto text = env("KILN_CACHE");
  if (text.empty()) return CacheMode::rw;
  if (auto mode = parse_cache_mode(text)) return *mode;
  throw Error("kiln settings: KILN_CACHE: expected one of rw, ro, off, strict, got '" +
              std::string(text) + "'");
}

}  // namespace kiln
