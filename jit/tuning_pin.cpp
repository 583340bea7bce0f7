#include "jit/tuning_pin.h"

#include "cache/error.h"
#include "cache/tuning_db.h"
#include "jit/tuning_bundle.h"
#include "templates/types.h"
#include "tuner/tuner.h"

namespace kiln::jit {
namespace {

using nlohmann::json;

std::string entry_name(const report::StoredDocument& stored) {
  return stored.device + "/" + stored.problem + ".r" + std::to_string(stored.bucket);
}

bool selected(const report::StoredDocument& stored, const PinRequest& request) {
  if (stored.document.is_discarded() || !stored.document.is_object()) {
    return false;
  }
  if (stored.document.value("source", "") == "prewarm") {
    return false;  // measured results only
  }
  if (!report::device_matches(stored, request.device)) {
    return false;
  }
  if (!request.op.empty() && !stored.problem.starts_with(request.op + ".")) {
    return false;
  }
  if (!request.problem.empty() && stored.problem != request.problem) {
    return false;
  }
  return !request.bucket || stored.bucket == *request.bucket;
}

// Makes the measured candidate `key` the winner, saying so in the reason.
void choose_winner(json& document, const std::string& key, const std::string& name) {
  const TuneResult result = document.get<TuneResult>();
  for (const Trial& trial : result.trials) {
    if (trial.config.key() != key) {
      continue;
    }
    if (trial.status != TrialStatus::ok) {
      std::string why = "kiln tune pin: --config ";
      why += key;
      why += " did not measure ok in ";
      why += name;
      why += " (";
      why += trial_status_name(trial.status);
      why += ")";
      throw Error(why);
    }
    if (trial.config != result.winner) {
      document["reason"] = "pinned by hand: " + key + " chosen over the tuner's winner " +
                           result.winner.key() + " (" + result.reason + ")";
    }
    document["winner"] = trial.config;
    return;
  }
  throw Error("kiln tune pin: --config " + key + " is not a candidate measured in " + name);
}

}  // namespace

bool is_pinned(const json& document) {
  const auto it = document.find("pinned");
  return it != document.end() && it->is_boolean() && it->get<bool>();
}

std::string stale_reason(const json& document, const std::string& kiln_version,
                         const std::string& nvrtc_version) {
  if (is_pinned(document)) {
    return {};
  }
  const auto versions = document.find("versions");
  if (versions == document.end() || !versions->is_object()) {
    return "it records no versions";
  }
  const auto differs = [&](const char* name, const std::string& current) -> std::string {
    const std::string stored = versions->value(name, "");
    if (stored == current) {
      return {};
    }
    return std::string(name) + " " + (stored.empty() ? "unknown" : stored) + ", now " + current;
  };
  std::string why = differs("kiln", kiln_version);
  const std::string nvrtc = differs("nvrtc", nvrtc_version);
  if (!nvrtc.empty()) {
    why += (why.empty() ? "" : "; ") + nvrtc;
  }
  return why.empty() ? why : "measured with " + why;
}

PinOutcome set_pinned(const std::filesystem::path& root, const PinRequest& request) {
  const char* what = request.pin ? "kiln tune pin" : "kiln tune unpin";
  if (!request.op.empty() && !parse_op(request.op)) {
    throw Error(std::string(what) + ": --op: expected a known op name, got '" + request.op + "'");
  }
  std::vector<report::StoredDocument> chosen;
  for (report::StoredDocument& stored : read_tuning_documents(root)) {
    if (selected(stored, request)) {
      chosen.push_back(std::move(stored));
    }
  }
  if (chosen.empty()) {
    throw Error(std::string(what) + ": no tuning result in " + root.string() +
                " matches the selection (see `kiln report`)");
  }
  if (!request.config.empty() && chosen.size() != 1) {
    throw Error(std::string(what) + ": --config picks one result's winner, but " +
                std::to_string(chosen.size()) +
                " results match: narrow it with --device, --problem and --bucket");
  }
  PinOutcome outcome;
  TuningDb db(root, CacheMode::rw);
  for (report::StoredDocument& stored : chosen) {
    const std::string name = entry_name(stored);
    json& document = stored.document;
    const std::string before = document.dump();
    if (request.pin) {
      if (!request.config.empty()) {
        choose_winner(document, request.config, name);
      }
      document["pinned"] = true;
    } else {
      document.erase("pinned");
    }
    if (document.dump() == before) {
      outcome.unchanged.push_back(name);
      continue;
    }
    if (!db.store(stored.device, stored.problem, stored.bucket, document)) {
      throw Error(std::string(what) + ": could not store " + name + " (see the log)");
    }
    outcome.changed.push_back(name);
  }
  return outcome;
}

}  // namespace kiln::jit
