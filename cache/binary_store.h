// The binary store: one file per compiled kernel under <root>/v1/bin/<k0k1>/<key>.bin, each
// with a header that makes it validate itself (magic, format version, echoed key, payload
// length, checksum). Writes are atomic (unique temp file in the same folder, then rename).
// Readers take no lock. A bad entry is a miss: counted, moved aside, and rebuilt by the
// caller. Every event is also counted in the cache's statistics (cache/cache_stats.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/settings.h"

namespace kiln {

struct BinaryStoreStats {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t corrupt = 0;  // entries that failed validation (moved aside)
  std::uint64_t stores = 0;
  std::uint64_t store_failures = 0;  // could not write (read-only dir, full disk, ...)
};

class BinaryStore {
 public:
  // Entry format version; bump when the header or payload layout changes.
  static constexpr std::uint32_t kFormatVersion = 1;

  // In rw mode the store is kept under KILN_CACHE_MAX_SIZE (least recently used entries are
  // trimmed after stores); `max_bytes` 0 means unbounded.
  BinaryStore(std::filesystem::path root, CacheMode mode);
  BinaryStore(std::filesystem::path root, CacheMode mode, std::uint64_t max_bytes);

  // The payload stored under `key`, or nullopt (missing, unreadable, or invalid).
  // In mode off, always nullopt. A hit stamps the entry as used (rw mode), for trimming.
  // `count_miss` false: a second look after taking the key's compile lock, whose miss the first
  // look already counted.
  std::optional<std::vector<char>> load(std::string_view key, bool count_miss = true);
  // Publishes atomically. Returns false (and logs once per reason) when it could not;
  // never leaves a partial file under the entry's name. No-op returning false unless rw.
  bool store(std::string_view key, std::span<const char> payload);

  std::filesystem::path path_for(std::string_view key) const;
  const std::filesystem::path& root() const { return root_; }
  CacheMode mode() const { return mode_; }
  BinaryStoreStats stats() const;

 private:
  void trim_now_and_then();

  std::filesystem::path root_;
  CacheMode mode_;
  std::uint64_t max_bytes_ = 0;
  std::atomic<std::uint64_t> hits_{0}, misses_{0}, corrupt_{0}, stores_{0}, store_failures_{0};
};

// Writes `bytes` to `target` atomically: a unique temp file in the same folder, flushed,
// then renamed over the target. Creates missing folders. Throws kiln::Error on failure,
// leaving no temp file behind.
void write_file_atomic(const std::filesystem::path& target, std::span<const char> bytes);

}  // namespace kiln
