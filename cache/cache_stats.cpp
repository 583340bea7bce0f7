#include "cache/cache_stats.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/binary_store.h"
#include "cache/file_io.h"
#include "cache/file_lock.h"

namespace kiln {
namespace {

// Enough for any queue of processes updating a few bytes each; past it the event is dropped
// rather than stalling an op call.
constexpr std::chrono::seconds kStatsLockTimeout{10};

std::mutex& process_mutex() {
  static std::mutex mutex;
  return mutex;
}

CacheCounters& process_counters() {
  static CacheCounters counters;
  return counters;
}

// Counts not yet added to each rw cache's file. Events that matter to someone reading the
// statistics right away (compiles, corrupt entries, failed stores, lock waits, evictions) are
// written at once; hits, misses and stores at most once a second and at exit, so a busy
// process does not serialise on the stats lock.
struct Pending {
  std::map<std::filesystem::path, CacheCounters> by_root;
  std::chrono::steady_clock::time_point last_flush = std::chrono::steady_clock::now();
  pid_t owner = ::getpid();
};
Pending& pending() {
  static Pending* p = new Pending();  // never destroyed: flushed from an atexit handler
  // A forked child inherits its parent's pending counts; they are the parent's to write.
  if (p->owner != ::getpid()) {
    p->by_root.clear();
    p->owner = ::getpid();
  }
  return *p;
}
constexpr std::chrono::seconds kFlushEvery{1};

bool is_urgent(const CacheCounters& d) {
  return d.compiles || d.corrupt || d.store_failures || d.lock_waits || d.lock_timeouts ||
         d.evicted;
}

void persist(const std::filesystem::path& root, const CacheCounters& delta) {
  try {
    // Only an existing cache gets a stats file: counting must not create a cache folder that
    // the store itself could not (or did not need to) create.
    std::error_code ec;
    if (!std::filesystem::is_directory(root / kCacheLayout, ec)) return;
    KeyLock lock(lock_path(root, "stats"), kStatsLockTimeout);
    if (!lock.held()) return;
    CacheCounters total = persisted_cache_counters(root);
    total += delta;
    const std::string text = nlohmann::json(total).dump(1) + "\n";
    detail::write_file_atomic_quiet(cache_stats_path(root), text);
  } catch (...) {
    // Statistics are advisory; an op never fails because they could not be written.
  }
}

// Takes the pending counts (of `root`, or of every root when null) under the process mutex.
std::vector<std::pair<std::filesystem::path, CacheCounters>> take_pending(
    const std::filesystem::path* root) {
  std::vector<std::pair<std::filesystem::path, CacheCounters>> taken;
  auto& p = pending();
  for (auto it = p.by_root.begin(); it != p.by_root.end();) {
    if (!root || it->first == *root) {
      taken.emplace_back(it->first, it->second);
      it = p.by_root.erase(it);
    } else {
      ++it;
    }
  }
  p.last_flush = std::chrono::steady_clock::now();
  return taken;
}

void flush_at_exit() {
  std::vector<std::pair<std::filesystem::path, CacheCounters>> taken;
  {
    std::lock_guard lock(process_mutex());
    taken = take_pending(nullptr);
  }
  for (const auto& [root, delta] : taken) persist(root, delta);
}

}  // namespace

CacheCounters& CacheCounters::operator+=(const CacheCounters& o) {
  binary_hits += o.binary_hits;
  binary_misses += o.binary_misses;
  corrupt += o.corrupt;
  stores += o.stores;
  store_failures += o.store_failures;
  evicted += o.evicted;
  evicted_bytes += o.evicted_bytes;
  tuning_hits += o.tuning_hits;
  tuning_misses += o.tuning_misses;
  compiles += o.compiles;
  compile_ms += o.compile_ms;
  lock_waits += o.lock_waits;
  lock_timeouts += o.lock_timeouts;
  lock_wait_ms += o.lock_wait_ms;
  return *this;
}

void to_json(nlohmann::json& j, const CacheCounters& c) {
  j = nlohmann::json{
      {"binary_hits", c.binary_hits},
      {"binary_misses", c.binary_misses},
      {"corrupt", c.corrupt},
      {"stores", c.stores},
      {"store_failures", c.store_failures},
      {"evicted", c.evicted},
      {"evicted_bytes", c.evicted_bytes},
      {"tuning_hits", c.tuning_hits},
      {"tuning_misses", c.tuning_misses},
      {"compiles", c.compiles},
      {"compile_ms", c.compile_ms},
      {"lock_waits", c.lock_waits},
      {"lock_timeouts", c.lock_timeouts},
      {"lock_wait_ms", c.lock_wait_ms},
  };
}

void from_json(const nlohmann::json& j, CacheCounters& c) {
  // Missing or mistyped fields read as zero: a stats file from an older kiln still adds up.
  auto get = [&](const char* name, auto& field) {
    const auto it = j.find(name);
    if (it != j.end() && it->is_number())
      field = it->get<std::remove_reference_t<decltype(field)>>();
  };
  get("binary_hits", c.binary_hits);
  get("binary_misses", c.binary_misses);
  get("corrupt", c.corrupt);
  get("stores", c.stores);
  get("store_failures", c.store_failures);
  get("evicted", c.evicted);
  get("evicted_bytes", c.evicted_bytes);
  get("tuning_hits", c.tuning_hits);
  get("tuning_misses", c.tuning_misses);
  get("compiles", c.compiles);
  get("compile_ms", c.compile_ms);
  get("lock_waits", c.lock_waits);
  get("lock_timeouts", c.lock_timeouts);
  get("lock_wait_ms", c.lock_wait_ms);
}

std::filesystem::path cache_stats_path(const std::filesystem::path& root) {
  return root / kCacheLayout / "stats.json";
}

CacheCounters persisted_cache_counters(const std::filesystem::path& root) {
  CacheCounters counters;
  const auto read = detail::read_whole_file(cache_stats_path(root));
  if (read.status != detail::ReadStatus::ok) return counters;
  const auto document = nlohmann::json::parse(read.bytes.begin(), read.bytes.end(), nullptr,
                                              /*allow_exceptions=*/false);
  if (document.is_object()) counters = document.get<CacheCounters>();
  return counters;
}

CacheCounters process_cache_counters() {
  std::lock_guard lock(process_mutex());
  return process_counters();
}

void count_cache_event(const std::filesystem::path& root, CacheMode mode,
                       const CacheCounters& delta) {
  if (mode != CacheMode::rw) {
    std::lock_guard lock(process_mutex());
    process_counters() += delta;
    return;
  }
  std::vector<std::pair<std::filesystem::path, CacheCounters>> taken;
  {
    std::lock_guard lock(process_mutex());
    process_counters() += delta;
    static const bool registered = std::atexit(flush_at_exit) == 0;
    (void)registered;
    pending().by_root[root] += delta;
    const bool due = std::chrono::steady_clock::now() - pending().last_flush >= kFlushEvery;
    if (is_urgent(delta)) {
      taken = take_pending(&root);
    } else if (due) {
      taken = take_pending(nullptr);
    }
  }
  for (const auto& [where, counts] : taken) persist(where, counts);
}

void flush_cache_counters() {
  flush_at_exit();
}

}  // namespace kiln
