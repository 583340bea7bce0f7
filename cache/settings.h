// Where the cache lives and how it may be used: KILN_CACHE_DIR and KILN_CACHE.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
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

// $KILN_CACHE_MAX_SIZE ("2G", "500M", "0" for unbounded; default 2G): the binary store is
// trimmed, least recently used first, when it grows past this. An invalid value is an Error.
std::uint64_t default_cache_max_bytes();
// "2G", "1.5GiB", "300M", "4096" (bytes) -> bytes; nullopt for anything else.
std::optional<std::uint64_t> parse_size(std::string_view text);
// "1.5 GiB" style text for a byte count.
std::string format_size(std::uint64_t bytes);

// $KILN_CACHE_LOCK_TIMEOUT in seconds (default 120): how long a process that misses waits for
// another one compiling the same kernel before it compiles anyway.
double default_lock_timeout_seconds();

// $KILN_RECORD: the manifest file every requested specialisation is appended to; empty when
// not recording.
std::filesystem::path default_record_path();

// Layout version of everything under the cache root: "v1".
inline constexpr std::string_view kCacheLayout = "v1";

}  // namespace kiln
