// The tuning database: one JSON document per (device fingerprint, problem, row bucket)
// under <root>/v1/tune/<device>/<problem key>.r<bucket>.json, holding every candidate's
// measurements, the winner, the versions and the timings. Same atomicity and bad-entry
// rules as the binary store; a document that does not parse or lacks "winner" is a miss.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/settings.h"

namespace kiln {

struct TuningEntry {
  std::string device;   // fingerprint (folder name)
  std::string problem;  // problem key
  std::int64_t bucket = 0;
  std::filesystem::path path;
};

class TuningDb {
 public:
  TuningDb(std::filesystem::path root, CacheMode mode);

  std::optional<nlohmann::json> load(std::string_view device, std::string_view problem,
                                     std::int64_t bucket);
  // Atomic publish; false (logged once) when it could not store. No-op unless rw.
  bool store(std::string_view device, std::string_view problem, std::int64_t bucket,
             const nlohmann::json& document);
  // Every entry on disk (for `kiln report`), sorted by device, problem, bucket.
  std::vector<TuningEntry> list() const;

  std::filesystem::path path_for(std::string_view device, std::string_view problem,
                                 std::int64_t bucket) const;

 private:
  std::filesystem::path root_;
  CacheMode mode_;
};

// Makes a string safe as one path component (device names have spaces and slashes).
std::string path_component(std::string_view text);

}  // namespace kiln
