#include "jit/prewarm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "cache/error.h"
#include "cache/tuning_db.h"
#include "jit/compiler.h"
#include "jit/nvrtc.h"
#include "jit/specialisation.h"
#include "templates/family.h"

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

// Writes the record unless an identical winner is already there (a re-run of the same
// prewarm rewrites nothing).
void store_prewarm_record(TuningDb& db, const PrewarmTarget& target, const Config& config,
                          const CompiledKernel& kernel) {
  const std::string device = prewarm_device(target.sm);
  const std::string problem_key = target.problem.key();
  if (auto existing = db.load(device, problem_key, kPrewarmBucket)) {
    try {
      if (existing->at("winner").get<Config>() == config) {
        return;
      }
    } catch (const std::exception&) {
      // unreadable winner: overwrite it
    }
  }
  nlohmann::json document = {
      {"source", "prewarm"},
      {"problem", target.problem},
      {"arch", "sm_" + std::to_string(target.sm)},
      {"winner", config},
      {"binary_key", kernel.key},
      {"name_expression", kernel.name_expression},
      {"versions", {{"kiln", KILN_VERSION}, {"nvrtc", nvrtc().version_string()}}},
  };
  db.store(device, problem_key, kPrewarmBucket, document);
}

}  // namespace

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
    for (DType dtype : dtypes) {
      for (std::int64_t hidden : found->second) {
        for (const Problem& problem : fam->common_problems(dtype, hidden, model)) {
          add(problem);
        }
      }
    }
  }
  return targets;
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
      bool reused = false;
      try {
        const Family& fam = family(target.problem.op);
        fam.check(target.problem);
        if (target.sm < 75) {
          throw ArgumentError("prewarm", "arch", "sm_75 or newer",
                              "sm_" + std::to_string(target.sm));
        }
        const CompileRequest request{
            &fam, target.problem, fam.heuristic(target.problem, DeviceTraits::for_arch(target.sm)),
            target.sm, BinaryFormat::cubin};
        Expected<CompiledKernel> compiled = compile(request, &store);
        if (!compiled) {
          throw compiled.error();
        }
        reused = compiled->from_cache;
        store_prewarm_record(db, target, request.config, compiled.value());
      } catch (const Error& error) {
        failure = describe(target) + ": " + error.message();
      } catch (const std::exception& error) {
        failure = describe(target) + ": " + error.what();
      }
      std::lock_guard lock(mutex);
      if (!failure.empty()) {
        ++summary.failed;
        summary.failures.push_back(std::move(failure));
      } else {
        ++(reused ? summary.reused : summary.compiled);
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
