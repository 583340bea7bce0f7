#include "jit/prewarm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "cache/error.h"
#include "cache/log.h"
#include "cache/tuning_db.h"
#include "jit/compiler.h"
#include "jit/nvrtc.h"
#include "jit/specialisation.h"
#include "jit/tuning_record.h"
#include "templates/family.h"
#include "tuner/tuner.h"

#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif

namespace kiln::jit {
namespace {

const Family* registered_family(Op op) {
  for (const Family* f : families()) {
    if (f->op() == op) {
      return f;
    }
  }
  return nullptr;
}

std::string describe(const PrewarmTarget& target) {
  return target.problem.key() + " sm_" + std::to_string(target.sm);
}

// Writes the record unless an identical one is already there (a re-run of the same prewarm
// rewrites nothing).
void store_prewarm_record(TuningDb& db, const PrewarmTarget& target,
                          const nlohmann::json& document) {
  const std::string device = prewarm_device(target.sm);
  const std::string problem_key = target.problem.key();
  if (auto existing = db.load(device, problem_key, kPrewarmBucket);
      existing && existing->is_object()) {
    if (existing->value("winner", nlohmann::json()) == document.at("winner") &&
        existing->value("by_rows", nlohmann::json()) ==
            document.value("by_rows", nlohmann::json())) {
      return;
    }
  }
  db.store(device, problem_key, kPrewarmBucket, document);
}

struct TargetOutcome {
  std::size_t compiled = 0;
  std::size_t reused = 0;
  // A row range whose config did not compile: left out of the record, whose other configs
  // still serve (its buckets take the next range's config, or the winner).
  std::vector<std::string> range_failures;
};

// Compiles the target's heuristic config, and its heuristic for the row buckets where that
// differs, each binary once, and writes the record naming them.
TargetOutcome prewarm_target(const PrewarmTarget& target, BinaryStore& store, TuningDb& db) {
  const Family& fam = family(target.problem.op);
  fam.check(target.problem);
  if (target.sm < 75) {
    throw ArgumentError("prewarm", "arch", "sm_75 or newer", "sm_" + std::to_string(target.sm));
  }
  TargetOutcome counts;
  std::deque<std::pair<Config, CompiledKernel>> binaries;  // row ranges may share a config
  const auto compiled_for = [&](const Config& config) -> const CompiledKernel& {
    for (const auto& [done, kernel] : binaries) {
      if (done == config) {
        return kernel;
      }
    }
    Expected<CompiledKernel> compiled =
        compile({&fam, target.problem, config, target.sm, BinaryFormat::cubin}, &store);
    if (!compiled) {
      throw compiled.error();
    }
    ++(compiled->from_cache ? counts.reused : counts.compiled);
    return binaries.emplace_back(config, std::move(compiled.value())).second;
  };
  const DeviceTraits traits = DeviceTraits::for_arch(target.sm);
  const Config row_blind = fam.heuristic(target.problem, traits);
  const CompiledKernel& kernel = compiled_for(row_blind);
  nlohmann::json document = {
      {"source", "prewarm"},
      {"problem", target.problem},
      {"arch", "sm_" + std::to_string(target.sm)},
      {"winner", row_blind},
      {"binary_key", kernel.key},
      {"name_expression", kernel.name_expression},
      {"versions", {{"kiln", KILN_VERSION}, {"nvrtc", nvrtc().version_string()}}},
  };
  for (const auto& [up_to_rows, config] : prewarm_row_configs(fam, target.problem, traits)) {
    try {
      document["by_rows"].push_back({{"up_to_rows", up_to_rows},
                                     {"winner", config},
                                     {"binary_key", compiled_for(config).key}});
    } catch (const Error& error) {
      counts.range_failures.push_back(
          describe(target) + ": its config for rows <= " + std::to_string(up_to_rows) + ", " +
          config.key() + " (left out of its record): " + error.message());
    }
  }
  store_prewarm_record(db, target, document);
  return counts;
}

}  // namespace

std::vector<std::pair<std::int64_t, Config>> prewarm_row_configs(const Family& family,
                                                                 const Problem& problem,
                                                                 const DeviceTraits& device) {
  const Config row_blind = family.heuristic(problem, device);
  std::vector<std::pair<std::int64_t, Config>> ranges;
  std::size_t differing = 0;  // ranges up to the last one whose config is not row_blind
  for (std::int64_t bucket = 1; bucket <= kSmallestLargestBucket; bucket *= 2) {
    Config config = family.heuristic_for_rows(problem, device, bucket);
    if (!ranges.empty() && ranges.back().second == config) {
      ranges.back().first = bucket;
    } else {
      ranges.emplace_back(bucket, std::move(config));
    }
    if (!(ranges.back().second == row_blind)) {
      differing = ranges.size();
    }
  }
  ranges.resize(differing);
  return ranges;
}

std::optional<Config> usable_prewarm_config(const nlohmann::json& record, const Family& family,
                                            const Problem& problem, const DeviceTraits& device,
                                            std::int64_t bucket, std::string& why) {
  std::optional<Config> for_rows;  // the record's range for the bucket
  std::vector<Config> compiled;    // every config the record names a binary for
  try {
    compiled.push_back(record.at("winner").get<Config>());
    for (const auto& range : record.value("by_rows", nlohmann::json::array())) {
      compiled.push_back(range.at("winner").get<Config>());
      if (!for_rows && bucket <= range.at("up_to_rows").get<std::int64_t>()) {
        for_rows = compiled.back();
      }
    }
  } catch (const std::exception& error) {
    why = std::string("unreadable record: ") + error.what();
    return std::nullopt;
  }
  // The ranges were drawn with the arch's typical SM count (DeviceTraits::for_arch); a GPU of
  // the arch with another count draws the line elsewhere, and gets its own heuristic for the
  // bucket wherever the record compiled it.
  const Config own = family.heuristic_for_rows(problem, device, bucket);
  if (std::find(compiled.begin(), compiled.end(), own) != compiled.end() &&
      family.invalid_reason(problem, own, device).empty()) {
    return own;
  }
  if (for_rows) {
    const std::string invalid = family.invalid_reason(problem, *for_rows, device);
    if (invalid.empty()) {
      return for_rows;
    }
    log::info("kiln: prewarm record for " + problem.key() +
              ": its config for rows <= " + std::to_string(bucket) + ", " + for_rows->key() +
              ", is no longer valid (" + invalid + "); trying its winner");
  }
  return usable_winner(record, family, problem, device, why);
}

std::string prewarm_device(int sm) {
  return "prewarm-sm_" + std::to_string(sm);
}

nlohmann::json manifest_record(const Problem& problem, int sm) {
  nlohmann::json record = problem;
  record["aux"] = problem.aux;
  record["arch"] = "sm_" + std::to_string(sm);
  return record;
}

std::vector<PrewarmTarget> expand_targets(const std::vector<Op>& ops,
                                          const std::vector<DType>& dtypes,
                                          const std::map<Op, std::vector<std::int64_t>>& sizes,
                                          const std::vector<int>& archs,
                                          std::vector<std::string>& notes,
                                          const PrewarmModel& model) {
  std::vector<Op> wanted;
  std::map<Op, std::vector<std::int64_t>> wanted_sizes = sizes;
  for (Op op : ops) {
    wanted.push_back(op);
    const auto backward = model.training ? backward_of(op) : std::nullopt;
    if (!backward || std::find(ops.begin(), ops.end(), *backward) != ops.end()) {
      continue;
    }
    wanted.push_back(*backward);
    if (const auto found = sizes.find(op); found != sizes.end()) {
      wanted_sizes[*backward] = found->second;
    }
  }
  std::vector<PrewarmTarget> targets;
  const auto add = [&](const Problem& problem) {
    for (int sm : archs) {
      PrewarmTarget target{problem, sm};
      if (std::find(targets.begin(), targets.end(), target) == targets.end()) {
        targets.push_back(target);
      }
    }
  };
  // The dtypes an op is prewarmed in: those asked for, and fp32 where the model runs it (or
  // the op it is the backward of) in fp32 whatever its own dtype.
  const auto dtypes_of = [&](Op op) {
    std::vector<DType> chosen = dtypes;
    const bool fp32 = std::any_of(model.fp32_ops.begin(), model.fp32_ops.end(), [&](Op f) {
      return f == op || (model.training && backward_of(f) == op);
    });
    if (fp32 && std::find(chosen.begin(), chosen.end(), DType::f32) == chosen.end()) {
      chosen.push_back(DType::f32);
    }
    return chosen;
  };
  for (Op op : wanted) {
    const Family* fam = registered_family(op);
    if (!fam) {
      notes.push_back("skipping " + std::string(op_name(op)) +
                      ": its op family is not registered in this build of kiln");
      continue;
    }
    const auto found = wanted_sizes.find(op);
    if (found == wanted_sizes.end() || found->second.empty()) {
      notes.push_back("skipping " + std::string(op_name(op)) + ": no size given for it");
      continue;
    }
    for (DType dtype : dtypes_of(op)) {
      for (std::int64_t hidden : found->second) {
        for (const Problem& problem : fam->common_problems(dtype, hidden, model)) {
          add(problem);
        }
      }
    }
  }
  return targets;
}

std::vector<PrewarmTarget> listed_targets(const std::vector<Op>& ops,
                                          const std::vector<std::int64_t>& hiddens,
                                          const std::vector<DType>& dtypes,
                                          const std::vector<int>& archs, bool training,
                                          std::vector<std::string>& notes) {
  std::map<Op, std::vector<std::int64_t>> sizes;
  for (Op op : ops) {
    sizes[op] = hiddens;
  }
  return expand_targets(ops, dtypes, sizes, archs, notes, PrewarmModel{.training = training});
}

std::vector<PrewarmTarget> targets_from_manifest(const ManifestRead& manifest,
                                                 const std::vector<int>& archs,
                                                 std::vector<std::string>& notes) {
  std::vector<PrewarmTarget> targets;
  if (manifest.bad_lines) {
    notes.push_back("manifest: skipped " + std::to_string(manifest.bad_lines) +
                    " line(s) that are not JSON records");
  }
  for (const auto& record : manifest.records) {
    Problem problem;
    std::vector<int> record_archs = archs;
    try {
      problem = record.get<Problem>();
      if (record_archs.empty()) {
        record_archs.push_back(parse_arch(record.at("arch").get<std::string>()));
      }
    } catch (const std::exception& error) {
      notes.push_back("manifest: skipped a record (" + std::string(error.what()) +
                      "): " + record.dump());
      continue;
    }
    if (!registered_family(problem.op)) {
      notes.push_back("manifest: skipped " + problem.key() +
                      ": its op family is not registered in this build of kiln");
      continue;
    }
    for (int sm : record_archs) {
      PrewarmTarget target{problem, sm};
      if (std::find(targets.begin(), targets.end(), target) == targets.end()) {
        targets.push_back(target);
      }
    }
  }
  return targets;
}

PrewarmSummary prewarm(const std::vector<PrewarmTarget>& targets, BinaryStore& store,
                       const PrewarmOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  TuningDb db(store.root(), store.mode());
  PrewarmSummary summary;
  std::mutex mutex;  // guards summary and progress
  std::atomic<std::size_t> next{0};
  std::size_t done = 0;

  auto work = [&] {
    for (std::size_t i = next++; i < targets.size(); i = next++) {
      const PrewarmTarget& target = targets[i];
      std::string failure;
      TargetOutcome counts;
      try {
        counts = prewarm_target(target, store, db);
      } catch (const Error& error) {
        failure = describe(target) + ": " + error.message();
      } catch (const std::exception& error) {
        failure = describe(target) + ": " + error.what();
      }
      std::lock_guard lock(mutex);
      summary.compiled += counts.compiled;
      summary.reused += counts.reused;
      if (!failure.empty() || !counts.range_failures.empty()) {
        ++summary.failed;
      }
      if (!failure.empty()) {
        summary.failures.push_back(std::move(failure));
      }
      for (std::string& range : counts.range_failures) {
        summary.failures.push_back(std::move(range));
      }
      ++done;
      if (options.progress) {
        options.progress(done, targets.size());
      }
    }
  };

  const int jobs = std::max(1, std::min<int>(options.jobs, static_cast<int>(targets.size())));
  std::vector<std::thread> workers;
  for (int j = 1; j < jobs; ++j) {
    workers.emplace_back(work);
  }
  work();
  for (auto& worker : workers) {
    worker.join();
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace kiln::jit
