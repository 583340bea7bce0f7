// Looking after a cache as a whole (`kiln cache ls|verify|trim|clear|export|import`):
// listing binary entries with their last use, validating every entry, trimming the least
// recently used ones to a size bound, and moving validated entries between caches.
//
// Last use is an explicit stamp: `<key>.used` beside each entry, whose modification time the
// store sets on every hit (in rw mode). Access times are not used because most filesystems
// are mounted noatime or relatime; the entry's own time is its creation, the fallback.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace kiln {

struct BinaryEntryInfo {
  std::string key;
  std::filesystem::path path;
  std::uint64_t bytes = 0;
  std::int64_t last_used = 0;  // seconds since the epoch
};

// Every binary entry under <root>/v1/bin (by name; not validated), oldest use first.
std::vector<BinaryEntryInfo> list_binary_entries(const std::filesystem::path& root);

// Marks the entry at `entry_path` as used now. Best effort, silent.
void touch_used(const std::filesystem::path& entry_path);
std::filesystem::path used_stamp_path(const std::filesystem::path& entry_path);

struct TrimResult {
  std::uint64_t removed = 0, removed_bytes = 0;
  std::uint64_t kept = 0, kept_bytes = 0;
  std::uint64_t debris_removed = 0;  // stale temp files, and entries moved aside a day ago
};

// Removes least recently used entries until the binary store holds at most `max_bytes`, and
// temp files older than an hour (left by killed writers) and moved-aside corrupt entries.
// `target_bytes` (<= max_bytes) is where trimming stops once it has to start, so a cache
// at its bound is not trimmed on every store. Holds the cache's "trim" lock while it works;
// returns at once (all zeros) when `wait` is false and another process is trimming.
TrimResult trim_cache(const std::filesystem::path& root, std::uint64_t max_bytes,
                      std::uint64_t target_bytes, bool wait = true);

struct VerifyResult {
  std::uint64_t binaries = 0, bad_binaries = 0;
  std::uint64_t tuning_results = 0, bad_tuning_results = 0;
  std::vector<std::string> problems;  // "<path>: <why>" for each bad entry (moved aside)
};

// Validates every binary entry and tuning result; bad ones are moved aside and counted as
// corrupt in the cache's statistics.
VerifyResult verify_cache(const std::filesystem::path& root);

// Removes everything kiln keeps under <root>/v1 (entries, tuning results, locks, stats).
// Returns the number of files removed.
std::uint64_t clear_cache(const std::filesystem::path& root);

struct TransferResult {
  std::uint64_t copied = 0;   // entries written to the destination
  std::uint64_t present = 0;  // already there (same content key), left alone
  std::uint64_t bad = 0;      // failed validation, not copied
};

// Copies every valid entry (binaries and tuning results) of the cache at `root` into a bundle
// folder `bundle` with the same layout (a cache itself: it can be used as KILN_CACHE_DIR, or
// tarred and shipped). Each file is published atomically.
TransferResult export_cache(const std::filesystem::path& root, const std::filesystem::path& bundle);
// Copies every valid entry of `bundle` into the cache at `root` (validated on the way in).
TransferResult import_cache(const std::filesystem::path& root, const std::filesystem::path& bundle);

}  // namespace kiln
