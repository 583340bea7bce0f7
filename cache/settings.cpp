#include "cache/settings.h"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
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

namespace kiln {

std::optional<std::uint64_t> parse_size(std::string_view text) {
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  double number = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (error != std::errc() || end == text.data() || !(number >= 0)) return std::nullopt;
  std::string unit(end, text.data() + text.size());
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  for (char& c : unit) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  // Binary units throughout (as ccache's suffixes): a cache bound need not be exact.
  static constexpr std::array<std::pair<std::string_view, double>, 13> kUnits = {{
      {"", 1.0},
      {"B", 1.0},
      {"K", 1024.0},
      {"KB", 1024.0},
      {"KIB", 1024.0},
      {"M", 1048576.0},
      {"MB", 1048576.0},
      {"MIB", 1048576.0},
      {"G", 1073741824.0},
      {"GB", 1073741824.0},
      {"GIB", 1073741824.0},
      {"T", 1099511627776.0},
      {"TIB", 1099511627776.0},
  }};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name) {
      const double bytes = std::floor(number * scale);
      if (bytes > 1.8e19) return std::nullopt;
      return static_cast<std::uint64_t>(bytes);
    }
  }
  return std::nullopt;
}

std::string format_size(std::uint64_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", value, kNames[unit]);
  return text;
}

std::uint64_t default_cache_max_bytes() {
  constexpr std::uint64_t kDefault = std::uint64_t{2} << 30;
  auto text = env("KILN_CACHE_MAX_SIZE");
  if (text.empty()) return kDefault;
  if (auto bytes = parse_size(text)) return *bytes;
  throw Error("kiln settings: KILN_CACHE_MAX_SIZE: expected a size such as 2G, 500M or 0, got '" +
              std::string(text) + "'");
}

double default_lock_timeout_seconds() {
  constexpr double kDefault = 120.0;
  auto text = env("KILN_CACHE_LOCK_TIMEOUT");
  if (text.empty()) return kDefault;
  double seconds = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (error != std::errc() || end != text.data() + text.size() || !(seconds >= 0)) {
    throw Error("kiln settings: KILN_CACHE_LOCK_TIMEOUT: expected seconds (a number >= 0), got '" +
                std::string(text) + "'");
  }
  return seconds;
}

std::filesystem::path default_record_path() {
  return std::filesystem::path(env("KILN_RECORD"));
}

}  // namespace kiln
