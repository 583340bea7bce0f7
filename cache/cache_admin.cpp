#include "cache/cache_admin.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <system_error>

#include <nlohmann/json.hpp>

#include "cache/cache_stats.h"
#include "cache/entry_format.h"
#include "cache/file_io.h"
#include "cache/file_lock.h"
#include "cache/settings.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kBinSuffix = ".bin";
constexpr std::string_view kUsedSuffix = ".used";
constexpr std::string_view kJsonSuffix = ".json";
// A temp file this old belongs to a writer that died: no publish takes an hour.
constexpr std::int64_t kStaleTempSeconds = 3600;
// An entry moved aside as corrupt stays a day for inspection: a store's own trim may run
// right after the rebuild that follows the move.
constexpr std::int64_t kAsideKeptSeconds = std::int64_t{24} * 3600;

fs::path bin_folder(const fs::path& root) {
  return root / kCacheLayout / "bin";
}
fs::path tune_folder(const fs::path& root) {
  return root / kCacheLayout / "tune";
}

std::int64_t mtime_of(const fs::path& path, bool& exists) {
  struct stat info {};
  exists = ::stat(path.c_str(), &info) == 0;
  return exists ? static_cast<std::int64_t>(info.st_mtim.tv_sec) : 0;
}

bool is_entry_name(std::string_view name) {
  return !name.empty() && name.front() != '.' && name.ends_with(kBinSuffix) &&
         name.size() > kBinSuffix.size();
}

// Calls fn(path) for every regular file in the folders directly below `folder`.
template <typename Fn>
void for_each_file_two_deep(const fs::path& folder, Fn&& fn) {
  std::error_code ec;
  for (fs::directory_iterator outer(folder, ec), end; !ec && outer != end; outer.increment(ec)) {
    std::error_code type_ec;
    if (!outer->is_directory(type_ec)) continue;
    std::error_code inner_ec;
    for (fs::directory_iterator inner(outer->path(), inner_ec); !inner_ec && inner != end;
         inner.increment(inner_ec)) {
      if (inner->is_regular_file(type_ec)) fn(inner->path());
    }
  }
}

// Why a tuning document is unusable; null when it is fine (same rules as TuningDb::load).
const char* tuning_problem(const std::vector<char>& bytes) {
  const auto document =
      nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) return "not valid JSON";
  if (!document.is_object()) return "not a JSON object";
  if (!document.contains("winner")) return "no \"winner\"";
  return nullptr;
}

// Copies every valid binary entry and tuning result from `from` into `to`.
TransferResult transfer(const fs::path& from, const fs::path& to) {
  TransferResult result;
  for_each_file_two_deep(bin_folder(from), [&](const fs::path& path) {
    const auto name = path.filename().string();
    if (!is_entry_name(name)) return;
    const auto key = name.substr(0, name.size() - kBinSuffix.size());
    const auto target = bin_folder(to) / path.parent_path().filename() / name;
    const auto read = detail::read_whole_file(path);
    if (read.status != detail::ReadStatus::ok || !detail::check_entry(read.bytes, key).ok()) {
      ++result.bad;
      return;
    }
    // A content key names its content: a valid entry under the same key is the same kernel.
    const auto existing = detail::read_whole_file(target);
    if (existing.status == detail::ReadStatus::ok &&
        detail::check_entry(existing.bytes, key).ok()) {
      ++result.present;
      return;
    }
    detail::write_file_atomic(target, read.bytes, /*durable=*/true);
    ++result.copied;
  });
  for_each_file_two_deep(tune_folder(from), [&](const fs::path& path) {
    const auto name = path.filename().string();
    if (name.empty() || name.front() == '.' || !name.ends_with(kJsonSuffix)) return;
    const auto read = detail::read_whole_file(path);
    if (read.status != detail::ReadStatus::ok || tuning_problem(read.bytes)) {
      ++result.bad;
      return;
    }
    const auto target = tune_folder(to) / path.parent_path().filename() / name;
    const auto existing = detail::read_whole_file(target);
    if (existing.status == detail::ReadStatus::ok && existing.bytes == read.bytes) {
      ++result.present;
      return;
    }
    detail::write_file_atomic(target, read.bytes, /*durable=*/true);
    ++result.copied;
  });
  return result;
}

}  // namespace

fs::path used_stamp_path(const fs::path& entry_path) {
  auto stamp = entry_path;
  stamp.replace_extension(kUsedSuffix);
  return stamp;
}

void touch_used(const fs::path& entry_path) {
  const auto stamp = used_stamp_path(entry_path);
  if (::utimensat(AT_FDCWD, stamp.c_str(), nullptr, 0) == 0) return;
  if (errno != ENOENT) return;
  const int fd = ::open(stamp.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) ::close(fd);
}

std::vector<BinaryEntryInfo> list_binary_entries(const fs::path& root) {
  std::vector<BinaryEntryInfo> entries;
  for_each_file_two_deep(bin_folder(root), [&](const fs::path& path) {
    const auto name = path.filename().string();
    if (!is_entry_name(name)) return;
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) return;
    BinaryEntryInfo entry;
    entry.key = name.substr(0, name.size() - kBinSuffix.size());
    entry.path = path;
    entry.bytes = static_cast<std::uint64_t>(info.st_size);
    bool stamped = false;
    const std::int64_t used = mtime_of(used_stamp_path(path), stamped);
    entry.last_used = std::max<std::int64_t>(info.st_mtim.tv_sec, stamped ? used : 0);
    entries.push_back(std::move(entry));
  });
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.last_used != b.last_used ? a.last_used < b.last_used : a.key < b.key;
  });
  return entries;
}

TrimResult trim_cache(const fs::path& root, std::uint64_t max_bytes, std::uint64_t target_bytes,
                      bool wait) {
  TrimResult result;
  KeyLock lock(lock_path(root, "trim"),
               wait ? std::chrono::duration<double>(60.0) : std::chrono::duration<double>(0.0));
  if (!wait && lock.outcome() == KeyLock::Outcome::timed_out) return result;

  const auto now = static_cast<std::int64_t>(std::time(nullptr));
  for (const fs::path& folder : {bin_folder(root), tune_folder(root)}) {
    for_each_file_two_deep(folder, [&](const fs::path& path) {
      const auto name = path.filename().string();
      const bool temp = name.starts_with(".") && name.find(".tmp.") != std::string::npos;
      const bool aside = name.find(".corrupt.") != std::string::npos;
      bool exists = false;
      const std::int64_t modified = mtime_of(path, exists);
      const std::int64_t age = now - modified;
      if (((aside && age > kAsideKeptSeconds) || (temp && age > kStaleTempSeconds)) &&
          ::unlink(path.c_str()) == 0) {
        ++result.debris_removed;
      }
    });
  }

  auto entries = list_binary_entries(root);
  std::uint64_t total = 0;
  for (const auto& entry : entries) total += entry.bytes;
  const std::uint64_t goal = total > max_bytes ? std::min(target_bytes, max_bytes) : total;
  std::size_t next = 0;
  while (total > goal && next < entries.size()) {
    const auto& oldest = entries[next++];
    if (::unlink(oldest.path.c_str()) != 0) continue;
    ::unlink(used_stamp_path(oldest.path).c_str());
    total -= oldest.bytes;
    ++result.removed;
    result.removed_bytes += oldest.bytes;
  }
  result.kept = entries.size() - result.removed;
  result.kept_bytes = total;
  if (result.removed) {
    CacheCounters delta;
    delta.evicted = result.removed;
    delta.evicted_bytes = result.removed_bytes;
    count_cache_event(root, CacheMode::rw, delta);
  }
  return result;
}

VerifyResult verify_cache(const fs::path& root) {
  VerifyResult result;
  for_each_file_two_deep(bin_folder(root), [&](const fs::path& path) {
    const auto name = path.filename().string();
    if (!is_entry_name(name)) return;
    ++result.binaries;
    const auto read = detail::read_whole_file(path);
    if (read.status == detail::ReadStatus::missing) return;  // trimmed meanwhile
    const char* problem =
        read.status == detail::ReadStatus::unreadable
            ? "unreadable"
            : detail::check_entry(read.bytes, name.substr(0, name.size() - 4)).problem;
    if (!problem) return;
    ++result.bad_binaries;
    result.problems.push_back(path.string() + ": " + problem);
    if (read.status == detail::ReadStatus::ok) detail::move_aside(path, read, problem);
  });
  for_each_file_two_deep(tune_folder(root), [&](const fs::path& path) {
    const auto name = path.filename().string();
    if (name.empty() || name.front() == '.' || !name.ends_with(kJsonSuffix)) return;
    ++result.tuning_results;
    const auto read = detail::read_whole_file(path);
    if (read.status != detail::ReadStatus::ok) return;
    const char* problem = tuning_problem(read.bytes);
    if (!problem) return;
    ++result.bad_tuning_results;
    result.problems.push_back(path.string() + ": " + problem);
    detail::move_aside(path, read, problem);
  });
  if (result.bad_binaries || result.bad_tuning_results) {
    CacheCounters delta;
    delta.corrupt = result.bad_binaries + result.bad_tuning_results;
    count_cache_event(root, CacheMode::rw, delta);
  }
  return result;
}

std::uint64_t clear_cache(const fs::path& root) {
  std::error_code ec;
  const auto removed = fs::remove_all(root / kCacheLayout, ec);
  if (ec) throw detail::FileError(root / kCacheLayout, "remove", ec.value());
  return static_cast<std::uint64_t>(removed);
}

TransferResult export_cache(const fs::path& root, const fs::path& bundle) {
  return transfer(root, bundle);
}

TransferResult import_cache(const fs::path& root, const fs::path& bundle) {
  return transfer(bundle, root);
}

}  // namespace kiln
