// Cache statistics: counters of this process, and the same counters summed over every process
// that used a cache in rw mode, persisted in <root>/v1/stats.json. Counts are added under the
// cache's "stats" lock (read, add, atomic replace), so concurrent processes never lose each
// other's counts. Persisting is best effort and silent: statistics never make an op fail and
// never add a log line (the store already says once what it could not store). Modes ro, strict
// and off never write, so their counts stay in the process.
#pragma once

#include <cstdint>
#include <filesystem>

#include <nlohmann/json_fwd.hpp>

#include "cache/settings.h"

namespace kiln {

struct CacheCounters {
  // The binary store tier.
  std::uint64_t binary_hits = 0;
  std::uint64_t binary_misses = 0;
  std::uint64_t corrupt = 0;  // entries that failed validation (moved aside, rebuilt)
  std::uint64_t stores = 0;
  std::uint64_t store_failures = 0;
  std::uint64_t evicted = 0;  // entries removed by trimming
  std::uint64_t evicted_bytes = 0;
  // The tuning database tier (device results and prewarm records).
  std::uint64_t tuning_hits = 0;
  std::uint64_t tuning_misses = 0;
  // NVRTC.
  std::uint64_t compiles = 0;
  double compile_ms = 0;
  // Per-key compile locks.
  std::uint64_t lock_waits = 0;     // a miss found another process compiling the key
  std::uint64_t lock_timeouts = 0;  // ... and gave up waiting
  double lock_wait_ms = 0;

  CacheCounters& operator+=(const CacheCounters& other);
  bool operator==(const CacheCounters&) const = default;
};

void to_json(nlohmann::json& j, const CacheCounters& counters);
void from_json(const nlohmann::json& j, CacheCounters& counters);

// Adds `delta` to this process's counters, and to the cache's persisted ones in mode rw:
// compiles, corrupt entries, failed stores, lock waits and evictions at once; hits, misses and
// stores at most once a second, and at exit.
void count_cache_event(const std::filesystem::path& root, CacheMode mode,
                       const CacheCounters& delta);

// Writes every count not yet persisted (done at exit anyway).
void flush_cache_counters();

// What this process counted (over every cache root it used).
CacheCounters process_cache_counters();
// What every rw process counted for the cache at `root` (zeros when there is no stats file).
CacheCounters persisted_cache_counters(const std::filesystem::path& root);
// <root>/v1/stats.json
std::filesystem::path cache_stats_path(const std::filesystem::path& root);

}  // namespace kiln
