#include "cache/tuning_db.h"

#include <algorithm>
#include <charconv>
#include <string>
#include <system_error>
#include <tuple>

#include "cache/cache_stats.h"
#include "cache/file_io.h"
#include "cache/hash.h"
#include "cache/log.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSuffix = ".json";
constexpr std::string_view kBucketMark = ".r";
// Keeps `<component>.r<bucket>.json` and the temp name built from it under NAME_MAX (255).
constexpr std::size_t kMaxComponent = 160;

bool is_safe(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' ||
         c == '_' || c == '-';
}

// Parses "<problem>.r<bucket>.json"; false for anything else (temp files, moved-aside files).
bool parse_entry_name(std::string_view name, std::string& problem, std::int64_t& bucket) {
  if (name.empty() || name.front() == '.' || !name.ends_with(kSuffix)) return false;
  name.remove_suffix(kSuffix.size());
  auto mark = name.rfind(kBucketMark);
  if (mark == std::string_view::npos || mark == 0) return false;
  auto digits = name.substr(mark + kBucketMark.size());
  auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), bucket);
  if (error != std::errc() || end != digits.data() + digits.size() || digits.empty()) {
    return false;
  }
  problem = std::string(name.substr(0, mark));
  return true;
}

}  // namespace

std::string path_component(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) out.push_back(is_safe(c) ? c : '_');
  // A leading dot would hide the file and could read as one of the store's temp names, and it
  // also rules out "." and "..".
  if (out.empty() || out.front() == '.') out.insert(out.begin(), '_');
  if (out.size() > kMaxComponent) {
    // Long names keep a readable prefix and stay distinct through a hash of the full text.
    auto hash = content_key({text}).substr(0, 16);
    out.resize(kMaxComponent - hash.size() - 1);
    out += "-" + hash;
  }
  return out;
}

TuningDb::TuningDb(std::filesystem::path root, CacheMode mode)
    : root_(std::move(root)), mode_(mode) {}

std::filesystem::path TuningDb::path_for(std::string_view device, std::string_view problem,
                                         std::int64_t bucket) const {
  return root_ / kCacheLayout / "tune" / path_component(device) /
         (path_component(problem) + std::string(kBucketMark) + std::to_string(bucket) +
          std::string(kSuffix));
}

std::optional<nlohmann::json> TuningDb::load(std::string_view device, std::string_view problem,
                                             std::int64_t bucket) {
  if (mode_ == CacheMode::off) return std::nullopt;
  auto path = path_for(device, problem, bucket);
  auto read = detail::read_whole_file(path);
  if (read.status == detail::ReadStatus::unreadable) {
    log::warn_once("tuning db read:" + root_.string() + ":" + std::to_string(read.code),
                   detail::FileError(path, "read", read.code).message());
  }
  CacheCounters miss;
  miss.tuning_misses = 1;
  if (read.status != detail::ReadStatus::ok) {
    count_cache_event(root_, mode_, miss);
    return std::nullopt;
  }
  auto document = nlohmann::json::parse(read.bytes.begin(), read.bytes.end(), nullptr,
                                        /*allow_exceptions=*/false);
  const char* problem_found = nullptr;
  if (document.is_discarded()) {
    problem_found = "not valid JSON";
  } else if (!document.is_object()) {
    problem_found = "not a JSON object";
  } else if (!document.contains("winner")) {
    problem_found = "no \"winner\"";
  }
  if (problem_found) {
    detail::move_aside(path, read, problem_found);
    miss.corrupt = 1;
    count_cache_event(root_, mode_, miss);
    return std::nullopt;
  }
  CacheCounters hit;
  hit.tuning_hits = 1;
  count_cache_event(root_, mode_, hit);
  return document;
}

bool TuningDb::store(std::string_view device, std::string_view problem, std::int64_t bucket,
                     const nlohmann::json& document) {
  if (mode_ != CacheMode::rw) return false;
  try {
    auto text = document.dump(2) + "\n";
    return detail::try_publish("tuning db", root_, path_for(device, problem, bucket), text);
  } catch (const std::exception& error) {
    // dump() throws on invalid UTF-8 in a string; that is a failed store, not a crash.
    log::warn_once("tuning db dump:" + std::string(error.what()),
                   "kiln cache: cannot store a tuning result: " + std::string(error.what()));
    return false;
  }
}

std::vector<TuningEntry> TuningDb::list() const {
  std::vector<TuningEntry> entries;
  if (mode_ == CacheMode::off) return entries;
  std::error_code ec;
  fs::directory_iterator devices(root_ / kCacheLayout / "tune", ec), end;
  for (; !ec && devices != end; devices.increment(ec)) {
    std::error_code type_error;
    if (!devices->is_directory(type_error)) continue;
    auto device = devices->path().filename().string();
    std::error_code inner_ec;
    fs::directory_iterator files(devices->path(), inner_ec);
    for (; !inner_ec && files != end; files.increment(inner_ec)) {
      TuningEntry entry;
      if (!files->is_regular_file(type_error)) continue;
      if (!parse_entry_name(files->path().filename().string(), entry.problem, entry.bucket)) {
        continue;
      }
      entry.device = device;
      entry.path = files->path();
      entries.push_back(std::move(entry));
    }
  }
  std::sort(entries.begin(), entries.end(), [](const TuningEntry& a, const TuningEntry& b) {
    return std::tie(a.device, a.problem, a.bucket) < std::tie(b.device, b.problem, b.bucket);
  });
  return entries;
}

}  // namespace kiln
