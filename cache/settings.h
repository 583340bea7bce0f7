// Where the cache lives and how it may be used: KILN_CACHE_DIR and KILN_CACHE.
#pragma once

#include <filesystem>
#include <optional>
#include <string_view>

namespace kiln {

enum class CacheMode : unsigned char {
  rw,      // read and write (default)
  ro,      // read only: misses are compiled in memory and never stored
  off,     // neither read nor written
  strict,  // read only, and a miss is an error (never compile; for pre-warmed fleets)
};

std::string_view cache_mode_name(CacheMode mode);
std::optional<CacheMode> parse_cache_mode(std::string_view text);

// $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln (else ./.kiln-cache).
std::filesystem::path default_cache_dir();
// $KILN_CACHE parsed, default rw (an unknown value is an Error naming it).
CacheMode default_cache_mode();

// Layout version of everything under the cache root: "v1".
inline constexpr std::string_view kCacheLayout = "v1";

}  // namespace kiln
