// Builds the report's JSON model from stored tuning documents (schema in tuner/report.h).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "cache/error.h"
#include "templates/family.h"
#include "tuner/report.h"
#include "tuner/tuner.h"

namespace kiln::report {
namespace {

using nlohmann::json;

json number_or_null(double value) {
  return std::isfinite(value) ? json(value) : json(nullptr);
}

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// The value at document[section][key] when it is present and of the expected kind.
const json* field(const json& document, const char* section, const char* key) {
  if (!document.is_object()) return nullptr;
  auto outer = document.find(section);
  if (outer == document.end() || !outer->is_object()) return nullptr;
  auto inner = outer->find(key);
  return inner == outer->end() ? nullptr : &*inner;
}

json positive_number(const json* value) {
  if (value && value->is_number() && value->get<double>() > 0) return *value;
  return nullptr;
}

json integer(const json* value) {
  return value && value->is_number_integer() ? *value : json(nullptr);
}

// Distinct string values seen over a device's documents, ", "-joined (a driver update between
// two tunes shows as "12.8, 13.0"); null when none was recorded.
json joined(const std::set<std::string>& values) {
  if (values.empty()) return nullptr;
  std::string text;
  for (const auto& value : values) text += (text.empty() ? "" : ", ") + value;
  return text;
}

const Trial* ok_trial_for(const TuneResult& result, const Config& config) {
  for (const Trial& trial : result.trials) {
    if (trial.config == config && trial.status == TrialStatus::ok) return &trial;
  }
  return nullptr;
}

double gbs(std::int64_t bytes, double median_us) {
  if (!(median_us > 0) || !std::isfinite(median_us)) return std::nan("");
  return static_cast<double>(bytes) / median_us / 1e3;
}

json result_json(const TuneResult& result, const json& copy_gbs) {
  const std::int64_t timed_rows = result.timed_rows();
  const std::int64_t bytes = family(result.problem.op).bytes_moved(result.problem, timed_rows);
  json candidates = json::array();
  for (const Trial& trial : result.trials) {
    const bool ok = trial.status == TrialStatus::ok;
    const double achieved = ok ? gbs(bytes, trial.median_us) : std::nan("");
    double percent = std::nan("");
    if (!copy_gbs.is_null()) percent = 100.0 * achieved / copy_gbs.get<double>();
    candidates.push_back({{"config", trial.config.key()},
                          {"config_fields", trial.config},
                          {"status", trial_status_name(trial.status)},
                          {"median_us", number_or_null(trial.median_us)},
                          {"spread_us", number_or_null(trial.spread_us)},
                          {"compile_ms", number_or_null(trial.compile_ms)},
                          {"repetitions", trial.repetitions},
                          {"message", trial.message},
                          {"achieved_gbs", number_or_null(achieved)},
                          {"percent_of_copy", number_or_null(percent)},
                          {"is_winner", trial.config == result.winner},
                          {"is_heuristic", trial.config == result.heuristic}});
  }
  const Trial* winner = ok_trial_for(result, result.winner);
  const Trial* heuristic = ok_trial_for(result, result.heuristic);
  const double winner_us = winner ? winner->median_us : std::nan("");
  const double heuristic_us = heuristic ? heuristic->median_us : std::nan("");
  const double speedup = winner_us > 0 ? heuristic_us / winner_us : std::nan("");
  return {{"problem_key", result.problem.key()},
          {"problem", result.problem},
          {"op", op_name(result.problem.op)},
          {"bucket_rows", result.bucket_rows},
          {"rows", timed_rows},
          {"mode", tune_mode_name(result.mode)},
          {"bytes_moved", bytes},
          {"copy_bandwidth_gbs", copy_gbs},
          {"heuristic", result.heuristic.key()},
          {"winner", result.winner.key()},
          {"reason", result.reason},
          {"tune_ms", number_or_null(result.tune_ms)},
          {"winner_median_us", number_or_null(winner_us)},
          {"heuristic_median_us", number_or_null(heuristic_us)},
          {"winner_gbs", number_or_null(gbs(bytes, winner_us))},
          {"speedup_over_heuristic", number_or_null(speedup)},
          {"candidates", std::move(candidates)}};
}

struct DeviceGroup {
  json header;  // name, sm, ... from the first document
  std::set<std::string> drivers, nvrtcs, kilns;
  json copy_gbs = nullptr;
  double tune_ms = 0;
  json results = json::array();
};

void note_versions(DeviceGroup& group, const json& document) {
  auto add = [&](std::set<std::string>& into, const char* key) {
    const json* value = field(document, "versions", key);
    if (value && value->is_string()) into.insert(value->get<std::string>());
  };
  add(group.drivers, "driver");
  add(group.nvrtcs, "nvrtc");
  add(group.kilns, "kiln");
}

json device_header(const StoredDocument& stored) {
  const json& d = stored.document;
  const json* fingerprint = field(d, "device", "fingerprint");
  const json* name = field(d, "device", "name");
  return {
      {"device", stored.device},
      {"fingerprint", fingerprint && fingerprint->is_string() ? *fingerprint : json(stored.device)},
      {"name", name && name->is_string() ? *name : json(stored.device)},
      {"sm", integer(field(d, "device", "sm"))},
      {"sm_count", integer(field(d, "device", "sm_count"))},
      {"memory_bytes", integer(field(d, "device", "memory_bytes"))},
      {"datasheet_bandwidth_gbs", positive_number(field(d, "device", "bandwidth_gbs"))}};
}

}  // namespace

std::optional<Format> parse_format(std::string_view text) {
  if (text == "json") return Format::json;
  if (text == "md" || text == "markdown") return Format::markdown;
  if (text == "html") return Format::html;
  return std::nullopt;
}

bool device_matches(const StoredDocument& stored, std::string_view wanted) {
  if (wanted.empty() || stored.device == wanted) return true;
  const json* fingerprint = field(stored.document, "device", "fingerprint");
  if (fingerprint && fingerprint->is_string() && fingerprint->get<std::string>() == wanted) {
    return true;
  }
  const json* name = field(stored.document, "device", "name");
  return name && name->is_string() &&
         lower(name->get<std::string>()).find(lower(wanted)) != std::string::npos;
}

json build(const std::vector<StoredDocument>& documents, const Filter& filter) {
  if (!filter.op.empty() && !parse_op(filter.op)) {
    throw ArgumentError("report", "op", "a known op name", "'" + filter.op + "'");
  }
  std::map<std::string, DeviceGroup> groups;  // by folder: sorted output
  json skipped = json::array();
  auto skip = [&](const StoredDocument& stored, const std::string& reason) {
    skipped.push_back({{"device", stored.device},
                       {"problem", stored.problem},
                       {"bucket", stored.bucket},
                       {"reason", reason}});
  };
  for (const StoredDocument& stored : documents) {
    if (stored.document.is_discarded() || !stored.document.is_object()) {
      skip(stored, "not a JSON object");
      continue;
    }
    if (!device_matches(stored, filter.device)) continue;
    if (stored.document.value("source", "") == "prewarm") {
      if (filter.op.empty() || stored.problem.starts_with(filter.op + ".")) {
        skip(stored, "prewarm record (compiled offline, not measured)");
      }
      continue;
    }
    TuneResult result;
    try {
      result = stored.document.get<TuneResult>();
      family(result.problem.op).check(result.problem);
    } catch (const std::exception& error) {
      skip(stored, error.what());
      continue;
    }
    if (!filter.op.empty() && op_name(result.problem.op) != filter.op) continue;
    DeviceGroup& group = groups[stored.device];
    if (group.header.is_null()) group.header = device_header(stored);
    note_versions(group, stored.document);
    // Percentages use the bandwidth measured with this document; the device shows the first.
    const json copy_gbs = positive_number(field(stored.document, "device", "copy_bandwidth_gbs"));
    if (group.copy_gbs.is_null()) group.copy_gbs = copy_gbs;
    if (std::isfinite(result.tune_ms)) group.tune_ms += result.tune_ms;
    json result_model = result_json(result, copy_gbs);
    result_model["pinned"] = stored.document.value("pinned", false);
    group.results.push_back(std::move(result_model));
  }

  json devices = json::array();
  double total_ms = 0;
  std::size_t total_results = 0;
  for (auto& [folder, group] : groups) {
    json device = std::move(group.header);
    device["driver"] = joined(group.drivers);
    device["nvrtc"] = joined(group.nvrtcs);
    device["kiln"] = joined(group.kilns);
    device["copy_bandwidth_gbs"] = group.copy_gbs;
    device["total_tune_ms"] = group.tune_ms;
    std::stable_sort(group.results.begin(), group.results.end(), [](const json& a, const json& b) {
      return std::tie(a.at("problem_key").get_ref<const std::string&>(), a.at("bucket_rows")) <
             std::tie(b.at("problem_key").get_ref<const std::string&>(), b.at("bucket_rows"));
    });
    total_results += group.results.size();
    device["results"] = std::move(group.results);
    total_ms += group.tune_ms;
    devices.push_back(std::move(device));
  }
  return {{"schema", "kiln.report"},
          {"version", kSchemaVersion},
          {"filter",
           {{"device", filter.device.empty() ? json(nullptr) : json(filter.device)},
            {"op", filter.op.empty() ? json(nullptr) : json(filter.op)}}},
          {"total_tune_ms", total_ms},
          {"total_results", total_results},
          {"devices", std::move(devices)},
          {"skipped", std::move(skipped)}};
}

std::string render(const json& model, Format format) {
  switch (format) {
    case Format::json:
      return model.dump(2) + "\n";
    case Format::markdown:
      return render_markdown(model);
    case Format::html:
      return render_html(model);
  }
  return {};
}

}  // namespace kiln::report
