#include "jit/tuning_bundle.h"

#include <set>
#include <string>

#include "cache/error.h"
#include "cache/file_io.h"
#include "cache/tuning_db.h"
#include "jit/prewarm.h"
#include "jit/tuning_pin.h"
#include "templates/family.h"
#include "tuner/tuner.h"

#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif

namespace kiln::jit {
namespace {

using nlohmann::json;

std::string entry_name(const std::string& device, const std::string& problem, std::int64_t bucket) {
  return device + "/" + problem + ".r" + std::to_string(bucket);
}

std::string entry_name(const json& entry) {
  if (!entry.is_object()) return "entry";
  auto text = [&](const char* key) {
    auto it = entry.find(key);
    return it != entry.end() && it->is_string() ? it->get<std::string>() : std::string("?");
  };
  auto bucket = entry.find("bucket");
  return text("device") + "/" + text("problem") + ".r" +
         (bucket != entry.end() && bucket->is_number_integer()
              ? std::to_string(bucket->get<std::int64_t>())
              : std::string("?"));
}

// The problem a document is for, checked against the entry's key and the family.
std::string problem_reason(const Problem& problem, const std::string& key) {
  if (problem.key() != key) {
    return "problem key: expected \"" + key + "\" (the entry's), the document's is \"" +
           problem.key() + "\"";
  }
  family(problem.op).check(problem);
  return {};
}

std::string prewarm_reason(const json& document, const std::string& device,
                           const std::string& problem, std::int64_t bucket) {
  const auto stored_problem = document.at("problem").get<Problem>();
  document.at("winner").get<Config>();
  const json by_rows = document.value("by_rows", json::array());
  if (!by_rows.is_array()) {
    return "by_rows: expected an array of row ranges, got " + std::string(by_rows.type_name());
  }
  std::int64_t last = 0;
  for (const auto& range : by_rows) {
    range.at("winner").get<Config>();
    range.at("binary_key").get<std::string>();
    const auto up_to = range.at("up_to_rows").get<std::int64_t>();
    if (up_to <= last) {
      return "by_rows: expected ranges of rows ascending from 1, got up_to_rows " +
             std::to_string(up_to) + " after " + std::to_string(last);
    }
    last = up_to;
  }
  const std::string arch = document.at("arch").get<std::string>();
  if (device != "prewarm-" + arch) {
    return "device: expected \"prewarm-" + arch + "\" for a prewarm record, got \"" + device + "\"";
  }
  if (bucket != kPrewarmBucket) {
    return "bucket: expected " + std::to_string(kPrewarmBucket) + " for a prewarm record, got " +
           std::to_string(bucket);
  }
  return problem_reason(stored_problem, problem);
}

std::string tune_reason(const json& document, const std::string& device, const std::string& problem,
                        std::int64_t bucket) {
  const auto result = document.get<TuneResult>();
  if (result.bucket_rows != bucket) {
    return "bucket: the entry says " + std::to_string(bucket) + ", the document " +
           std::to_string(result.bucket_rows);
  }
  const std::string fingerprint = document.at("device").at("fingerprint").get<std::string>();
  if (path_component(fingerprint) != device) {
    return "device: the entry says \"" + device + "\", the document was measured on \"" +
           fingerprint + "\"";
  }
  return problem_reason(result.problem, problem);
}

json read_json_file(const std::filesystem::path& path, const char* what) {
  const detail::FileRead read = detail::read_whole_file(path);
  if (read.status != detail::ReadStatus::ok) {
    throw Error(std::string(what) + ": cannot read " + path.string() +
                (read.status == detail::ReadStatus::missing ? ": no such file" : ""));
  }
  json parsed = json::parse(read.bytes.begin(), read.bytes.end(), nullptr, false);
  if (parsed.is_discarded()) {
    throw Error(std::string(what) + ": " + path.string() + " is not valid JSON");
  }
  return parsed;
}

}  // namespace

std::vector<report::StoredDocument> read_tuning_documents(const std::filesystem::path& root) {
  std::vector<report::StoredDocument> documents;
  for (const TuningEntry& entry : TuningDb(root, CacheMode::ro).list()) {
    report::StoredDocument stored{entry.device, entry.problem, entry.bucket, json()};
    const detail::FileRead read = detail::read_whole_file(entry.path);
    stored.document = read.status == detail::ReadStatus::ok
                          ? json::parse(read.bytes.begin(), read.bytes.end(), nullptr, false)
                          : json(json::value_t::discarded);
    documents.push_back(std::move(stored));
  }
  return documents;
}

std::string tuning_report(const std::filesystem::path& root, const report::Filter& filter,
                          report::Format format) {
  return report::render(report::build(read_tuning_documents(root), filter), format);
}

std::string invalid_entry_reason(const json& entry) {
  if (!entry.is_object()) return std::string("expected an object, got ") + entry.type_name();
  for (const char* key : {"device", "problem"}) {
    if (!entry.contains(key) || !entry[key].is_string() || entry[key].get<std::string>().empty()) {
      return std::string("\"") + key + "\": expected a non-empty string";
    }
  }
  if (!entry.contains("bucket") || !entry["bucket"].is_number_integer() ||
      entry["bucket"].get<std::int64_t>() < 0) {
    return "\"bucket\": expected an integer >= 0";
  }
  if (!entry.contains("document") || !entry["document"].is_object()) {
    return "\"document\": expected an object";
  }
  const auto device = entry["device"].get<std::string>();
  const auto problem = entry["problem"].get<std::string>();
  const auto bucket = entry["bucket"].get<std::int64_t>();
  if (path_component(device) != device) {
    return "\"device\": expected a database folder name, got \"" + device + "\"";
  }
  const json& document = entry["document"];
  try {
    return document.value("source", "") == "prewarm"
               ? prewarm_reason(document, device, problem, bucket)
               : tune_reason(document, device, problem, bucket);
  } catch (const std::exception& error) {
    return error.what();
  }
}

TuneTransfer export_tuning(const std::filesystem::path& root, const std::filesystem::path& bundle,
                           std::string_view device) {
  TuneTransfer transfer;
  json entries = json::array();
  for (report::StoredDocument& stored : read_tuning_documents(root)) {
    const std::string name = entry_name(stored.device, stored.problem, stored.bucket);
    if (stored.document.is_discarded()) {
      ++transfer.skipped_invalid;
      transfer.problems.push_back(name + ": not valid JSON");
      continue;
    }
    if (!report::device_matches(stored, device)) continue;
    json entry = {{"device", stored.device},
                  {"problem", stored.problem},
                  {"bucket", stored.bucket},
                  {"document", std::move(stored.document)}};
    if (std::string why = invalid_entry_reason(entry); !why.empty()) {
      ++transfer.skipped_invalid;
      transfer.problems.push_back(name + ": " + why);
      continue;
    }
    entries.push_back(std::move(entry));
    ++transfer.written;
  }
  const json document = {{"format", kTuneBundleFormat},
                         {"version", kTuneBundleVersion},
                         {"kiln", KILN_VERSION},
                         {"entries", std::move(entries)}};
  const std::string text = document.dump(2) + "\n";
  detail::write_file_atomic(bundle, text, /*durable=*/true);
  return transfer;
}

TuneTransfer import_tuning(const std::filesystem::path& root, const std::filesystem::path& bundle,
                           bool pin) {
  constexpr const char* kWhat = "kiln tune import";
  const json document = read_json_file(bundle, kWhat);
  if (!document.is_object() || document.value("format", "") != kTuneBundleFormat) {
    throw Error(std::string(kWhat) + ": " + bundle.string() + ": \"format\": expected \"" +
                std::string(kTuneBundleFormat) + "\"");
  }
  if (!document.contains("version") || document["version"] != kTuneBundleVersion) {
    throw Error(std::string(kWhat) + ": " + bundle.string() + ": \"version\": expected " +
                std::to_string(kTuneBundleVersion) + ", got " +
                (document.contains("version") ? document["version"].dump() : "none"));
  }
  if (!document.contains("entries") || !document["entries"].is_array()) {
    throw Error(std::string(kWhat) + ": " + bundle.string() + ": \"entries\": expected an array");
  }
  TuneTransfer transfer;
  TuningDb db(root, CacheMode::rw);
  // Read as the report reads, so that the check counts no cache hits or misses.
  std::set<std::string> pinned_here;
  for (const report::StoredDocument& stored : read_tuning_documents(root)) {
    if (!stored.document.is_discarded() && is_pinned(stored.document))
      pinned_here.insert(entry_name(stored.device, stored.problem, stored.bucket));
  }
  for (const json& entry : document["entries"]) {
    if (std::string why = invalid_entry_reason(entry); !why.empty()) {
      ++transfer.skipped_invalid;
      transfer.problems.push_back(entry_name(entry) + ": " + why);
      continue;
    }
    const auto device = entry["device"].get<std::string>();
    const auto problem = entry["problem"].get<std::string>();
    const auto bucket = entry["bucket"].get<std::int64_t>();
    if (pinned_here.contains(entry_name(device, problem, bucket))) {
      ++transfer.kept_pinned;
      transfer.problems.push_back(entry_name(entry) + ": pinned here, kept (unpin it to replace)");
      continue;
    }
    json document = entry["document"];
    if (pin) document["pinned"] = true;
    if (db.store(device, problem, bucket, document)) {
      ++transfer.written;
    } else {
      ++transfer.failed;
      transfer.problems.push_back(entry_name(entry) + ": could not be stored");
    }
  }
  return transfer;
}

}  // namespace kiln::jit
