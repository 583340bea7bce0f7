#include "cache/binary_store.h"

#include <string>

#include "cache/cache_admin.h"
#include "cache/cache_stats.h"
#include "cache/entry_format.h"
#include "cache/error.h"
#include "cache/file_io.h"
#include "cache/log.h"

namespace kiln {
namespace {

// Keys become file names, so only characters that are safe in one path component are taken.
// Content keys (32 hex digits) always pass; anything else is a caller's bug.
void check_key(std::string_view key) {
  bool ok = !key.empty() && key.size() <= 200;
  for (char c : key) {
    ok = ok && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                c == '_' || c == '-');
  }
  if (!ok) {
    throw Error(
        "kiln cache: binary store key: expected 1 to 200 characters of [A-Za-z0-9_-], got '" +
        std::string(key) + "'");
  }
}

CacheCounters one(std::uint64_t CacheCounters::*field) {
  CacheCounters delta;
  delta.*field = 1;
  return delta;
}

// How often (in successful stores of this process) the size bound is checked: a check lists
// the store, which costs far less than the compiles it follows, but need not follow each one.
constexpr std::uint64_t kTrimCheckEvery = 32;
// Once over its bound, the store is trimmed to this fraction of it, so that a full cache is not
// trimmed again on the next store.
constexpr double kTrimTargetFraction = 0.9;

}  // namespace

BinaryStore::BinaryStore(std::filesystem::path root, CacheMode mode)
    : BinaryStore(std::move(root), mode, mode == CacheMode::rw ? default_cache_max_bytes() : 0) {}

BinaryStore::BinaryStore(std::filesystem::path root, CacheMode mode, std::uint64_t max_bytes)
    : root_(std::move(root)), mode_(mode), max_bytes_(max_bytes) {}

std::filesystem::path BinaryStore::path_for(std::string_view key) const {
  check_key(key);
  std::string name(key);
  return root_ / kCacheLayout / "bin" / name.substr(0, 2) / (name + ".bin");
}

std::optional<std::vector<char>> BinaryStore::load(std::string_view key, bool count_miss) {
  auto path = path_for(key);
  if (mode_ == CacheMode::off) {
    ++misses_;
    count_cache_event(root_, mode_, one(&CacheCounters::binary_misses));
    return std::nullopt;
  }
  auto read = detail::read_whole_file(path);
  if (read.status != detail::ReadStatus::ok) {
    if (read.status == detail::ReadStatus::unreadable) {
      log::warn_once("binary store read:" + root_.string() + ":" + std::to_string(read.code),
                     detail::FileError(path, "read", read.code).message());
    }
    if (count_miss) {
      ++misses_;
      count_cache_event(root_, mode_, one(&CacheCounters::binary_misses));
    }
    return std::nullopt;
  }
  auto check = detail::check_entry(read.bytes, key);
  if (!check.ok()) {
    ++corrupt_;
    ++misses_;
    detail::move_aside(path, read, check.problem);
    CacheCounters delta;
    delta.corrupt = delta.binary_misses = 1;
    count_cache_event(root_, mode_, delta);
    return std::nullopt;
  }
  ++hits_;
  if (mode_ == CacheMode::rw) touch_used(path);
  count_cache_event(root_, mode_, one(&CacheCounters::binary_hits));
  read.bytes.erase(read.bytes.begin(),
                   read.bytes.begin() + static_cast<std::ptrdiff_t>(check.payload_offset));
  return std::move(read.bytes);
}

bool BinaryStore::store(std::string_view key, std::span<const char> payload) {
  auto path = path_for(key);
  if (mode_ != CacheMode::rw) return false;
  bool stored = false;
  try {
    stored = detail::try_publish("binary store", root_, path, detail::encode_entry(key, payload));
  } catch (...) {
    // Only encoding can get here (out of memory); a store that cannot be made is a miss later.
  }
  ++(stored ? stores_ : store_failures_);
  count_cache_event(root_, mode_,
                    one(stored ? &CacheCounters::stores : &CacheCounters::store_failures));
  if (stored) trim_now_and_then();
  return stored;
}

void BinaryStore::trim_now_and_then() {
  static std::atomic<std::uint64_t> stored_by_process{0};
  if (max_bytes_ == 0 || stored_by_process++ % kTrimCheckEvery != 0) return;
  try {
    trim_cache(root_, max_bytes_,
               static_cast<std::uint64_t>(static_cast<double>(max_bytes_) * kTrimTargetFraction),
               /*wait=*/false);
  } catch (...) {
    // Trimming is housekeeping: a failure leaves a larger cache, never a failed store.
  }
}

BinaryStoreStats BinaryStore::stats() const {
  BinaryStoreStats stats;
  stats.hits = hits_.load();
  stats.misses = misses_.load();
  stats.corrupt = corrupt_.load();
  stats.stores = stores_.load();
  stats.store_failures = store_failures_.load();
  return stats;
}

}  // namespace kiln
