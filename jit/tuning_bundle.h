// Moving tuning results between machines (`kiln tune export/import`), and reading the whole
// tuning database for `kiln report`. A bundle is one JSON file:
//
//   {"format": "kiln.tune-bundle", "version": 1, "kiln": "<version>",
//    "entries": [{"device": "<database folder>", "problem": "<problem key>",
//                 "bucket": <row bucket>, "document": {<the stored document>}}]}
//
// Import validates every entry before writing it (the document's schema, that its problem's
// key, row bucket and device fingerprint agree with the entry's, that the family accepts the
// problem) and writes the valid ones atomically through the tuning database; an invalid entry
// is skipped and said why, never fatal. A file that is not such a bundle at all is an Error
// and nothing is written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tuner/report.h"

namespace kiln::jit {

inline constexpr std::string_view kTuneBundleFormat = "kiln.tune-bundle";
inline constexpr int kTuneBundleVersion = 1;

// Every document of the tuning database at `root`, sorted by device, problem, bucket. Reads
// only: a bad file is returned unparsed (discarded) for the caller to report, not moved aside.
std::vector<report::StoredDocument> read_tuning_documents(const std::filesystem::path& root);

// `kiln report`: the database at `root` rendered in `format`.
std::string tuning_report(const std::filesystem::path& root, const report::Filter& filter,
                          report::Format format);

// Why a bundle entry may not be imported; empty when it is valid.
std::string invalid_entry_reason(const nlohmann::json& entry);

struct TuneTransfer {
  std::uint64_t written = 0;          // exported to the bundle, or imported into the cache
  std::uint64_t skipped_invalid = 0;  // failed validation
  std::uint64_t failed = 0;           // import only: valid, but the cache could not store it
  std::uint64_t kept_pinned = 0;      // import only: the cache's own result is pinned
  std::vector<std::string> problems;  // "<device>/<problem>.r<bucket>: <why>" per skip/failure
};

// Writes every valid document (of the device `device` names, as for the report; empty: all)
// to the bundle file `bundle`, atomically.
TuneTransfer export_tuning(const std::filesystem::path& root, const std::filesystem::path& bundle,
                           std::string_view device = {});
// `pin`: the imported results are pinned (see jit/tuning_pin.h). A result pinned in the cache
// is never replaced by an import.
TuneTransfer import_tuning(const std::filesystem::path& root, const std::filesystem::path& bundle,
                           bool pin = false);

}  // namespace kiln::jit
