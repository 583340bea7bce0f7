// TuneResult <-> JSON, the body of a tuning-database entry. Reading is strict: a missing key
// or an unknown name is an Error naming the field, so a damaged entry is treated as a miss.
#include <array>
#include <cmath>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "cache/error.h"
#include "tuner/tuner.h"

namespace kiln {
namespace {

using nlohmann::json;

constexpr std::string_view kWhere = "kiln tuner: tune result JSON";
constexpr std::array<TrialStatus, 5> kStatuses = {
    TrialStatus::ok, TrialStatus::compile_error, TrialStatus::resource_error,
    TrialStatus::launch_error, TrialStatus::wrong_result};

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error(std::string(kWhere) + ": " + path + ": " + what);
}

const json& member(const json& j, const std::string& key, const std::string& path) {
  if (!j.is_object()) fail(path, "expected an object, got " + std::string(j.type_name()));
  auto it = j.find(key);
  if (it == j.end()) fail(path, "expected key \"" + key + "\", missing");
  return *it;
}

// Reads j[key] as T, turning the json library's and templates' errors into one that names
// the field.
template <typename T>
T read(const json& j, const std::string& key, const std::string& path) {
  const json& value = member(j, key, path);
  try {
    return value.get<T>();
  } catch (const nlohmann::json::exception& e) {
    fail(path + "." + key, e.what());
  } catch (const Error& e) {
    fail(path + "." + key, e.what());
  }
}

// JSON has no NaN or infinity (the library writes them as null); a null time reads back as
// NaN so that an entry holding one stays readable.
json time_to_json(double value) {
  return std::isfinite(value) ? json(value) : json(nullptr);
}

double read_time(const json& j, const std::string& key, const std::string& path) {
  if (member(j, key, path).is_null()) return std::numeric_limits<double>::quiet_NaN();
  return read<double>(j, key, path);
}

std::string enum_names(auto values, auto name) {
  std::string names;
  for (auto value : values) names += (names.empty() ? "" : ", ") + std::string(name(value));
  return names;
}

TrialStatus read_status(const json& j, const std::string& path) {
  auto text = read<std::string>(j, "status", path);
  for (TrialStatus status : kStatuses) {
    if (text == trial_status_name(status)) return status;
  }
  fail(path + ".status",
       "expected one of " + enum_names(kStatuses, trial_status_name) + ", got \"" + text + "\"");
}

TuneMode read_mode(const json& j, const std::string& path) {
  auto text = read<std::string>(j, "mode", path);
  if (auto mode = parse_tune_mode(text)) return *mode;
  std::array<TuneMode, 3> modes = {TuneMode::off, TuneMode::fast, TuneMode::full};
  fail(path + ".mode",
       "expected one of " + enum_names(modes, tune_mode_name) + ", got \"" + text + "\"");
}

json trial_to_json(const Trial& trial) {
  return json{{"config", trial.config},
              {"status", trial_status_name(trial.status)},
              {"median_us", time_to_json(trial.median_us)},
              {"spread_us", time_to_json(trial.spread_us)},
              {"compile_ms", time_to_json(trial.compile_ms)},
              {"repetitions", trial.repetitions},
              {"message", trial.message}};
}

Trial trial_from_json(const json& j, const std::string& path) {
  Trial trial;
  trial.config = read<Config>(j, "config", path);
  trial.status = read_status(j, path);
  trial.median_us = read_time(j, "median_us", path);
  trial.spread_us = read_time(j, "spread_us", path);
  trial.compile_ms = read_time(j, "compile_ms", path);
  trial.repetitions = read<int>(j, "repetitions", path);
  trial.message = read<std::string>(j, "message", path);
  return trial;
}

}  // namespace

void to_json(json& j, const TuneResult& result) {
  json trials = json::array();
  for (const Trial& trial : result.trials) trials.push_back(trial_to_json(trial));
  j = json{{"problem", result.problem},
           {"bucket_rows", result.bucket_rows},
           {"mode", tune_mode_name(result.mode)},
           {"heuristic", result.heuristic},
           {"winner", result.winner},
           {"reason", result.reason},
           {"tune_ms", time_to_json(result.tune_ms)},
           {"trials", std::move(trials)}};
  j["rows"] = result.rows;
}

void from_json(const json& j, TuneResult& result) {
  const std::string path = "$";
  TuneResult read_result;
  read_result.problem = read<Problem>(j, "problem", path);
  read_result.bucket_rows = read<std::int64_t>(j, "bucket_rows", path);
  // Results stored before the tuner timed a call's own rows were timed on the bucket's.
  read_result.rows =
      j.contains("rows") ? read<std::int64_t>(j, "rows", path) : read_result.bucket_rows;
  read_result.mode = read_mode(j, path);
  read_result.heuristic = read<Config>(j, "heuristic", path);
  read_result.winner = read<Config>(j, "winner", path);
  read_result.reason = read<std::string>(j, "reason", path);
  read_result.tune_ms = read_time(j, "tune_ms", path);
  const json& trials = member(j, "trials", path);
  if (!trials.is_array()) {
    fail(path + ".trials", "expected an array, got " + std::string(trials.type_name()));
  }
  for (std::size_t i = 0; i < trials.size(); ++i) {
    read_result.trials.push_back(
        trial_from_json(trials[i], path + ".trials[" + std::to_string(i) + "]"));
  }
  result = std::move(read_result);
}

}  // namespace kiln
