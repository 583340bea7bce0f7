// A synthetic op family and a deterministic evaluator, so the tuner's search and selection
// are tested exactly, with no GPU and no dependence on the real families' spaces.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cache/error.h"
#include "templates/family.h"
#include "tuner/evaluator.h"

namespace kiln::testing {

// Space: every (vec_bytes, threads_per_row, cta_threads[, extras]) from the lists below with
// threads_per_row <= cta_threads and a vector count that divides the row evenly, in nested
// loop order (vec_bytes outermost).
class FakeFamily : public Family {
 public:
  std::vector<int> vec_bytes = {4, 8, 16};
  std::vector<int> threads_per_row = {8, 16, 32, 64, 128};
  std::vector<int> cta_threads = {64, 128, 256, 512};
  // An optional family-specific tunable ("persistent" 0/1), innermost in the space's order.
  bool with_extra = false;
  Config heuristic_config{16, 32, 128, {}};
  // Family::worth_measuring: every config unless set.
  std::function<bool(const Config&, std::int64_t rows)> worth;

  Op op() const override { return Op::rms_norm; }
  std::string_view header() const override { return "kiln/fake.cuh"; }

  void check(const Problem& problem) const override {
    if (problem.hidden <= 0) {
      throw ArgumentError("fake", "hidden", "> 0", std::to_string(problem.hidden));
    }
  }

  std::vector<Config> space(const Problem& problem, const DeviceTraits&) const override {
    std::vector<Config> configs;
    for (int vec : vec_bytes) {
      for (int tpr : threads_per_row) {
        for (int cta : cta_threads) {
          for (int extra : with_extra ? std::vector<int>{0, 1} : std::vector<int>{-1}) {
            Config config{vec, tpr, cta, {}};
            if (extra >= 0) config.extra["persistent"] = extra;
            if (invalid_reason(problem, config, DeviceTraits{}).empty()) {
              configs.push_back(config);
            }
          }
        }
      }
    }
    return configs;
  }

  std::string invalid_reason(const Problem& problem, const Config& config,
                             const DeviceTraits&) const override {
    if (config.threads_per_row > config.cta_threads) return "threads_per_row > cta_threads";
    std::int64_t per_vector = config.vec_bytes / static_cast<int>(dtype_size(problem.dtype));
    if (per_vector < 1 || problem.hidden % (per_vector * config.threads_per_row) != 0) {
      return "row does not split evenly";
    }
    return {};
  }

  Config heuristic(const Problem&, const DeviceTraits&) const override { return heuristic_config; }

  std::string name_expression(const Problem& problem, const Config& config) const override {
    return "kiln::fake<" + std::to_string(problem.hidden) + ", " + config.key() + ">";
  }

  LaunchGeometry geometry(const Problem&, const Config& config, std::int64_t rows) const override {
    LaunchGeometry geometry;
    std::int64_t per_cta = config.rows_per_cta();
    geometry.grid[0] = static_cast<std::uint32_t>((rows + per_cta - 1) / per_cta);
    geometry.block[0] = static_cast<std::uint32_t>(config.cta_threads);
    return geometry;
  }

  std::vector<BufferSpec> buffers(const Problem& problem, std::int64_t rows) const override {
    return {{"x", problem.dtype, rows * problem.hidden, false},
            {"y", problem.dtype, rows * problem.hidden, true}};
  }
  std::vector<std::byte> pack_params(const Problem&, std::int64_t,
                                     std::span<const std::uint64_t>) const override {
    return {};
  }
  std::int64_t bytes_moved(const Problem& problem, std::int64_t rows) const override {
    return 2 * rows * problem.hidden * static_cast<std::int64_t>(dtype_size(problem.dtype));
  }
  bool worth_measuring(const Problem&, const Config& config, const DeviceTraits&,
                       std::int64_t rows) const override {
    return !worth || worth(config, rows);
  }
};

// A smooth bowl with its unique minimum at v16.t64.c256 (persistent=0).
inline double bowl_time_us(const Config& config) {
  auto steps = [](double a, double b) { return std::abs(std::log2(a / b)); };
  double persistent = config.extra.count("persistent") ? config.extra.at("persistent") : 0;
  return 5.0 + 0.5 * steps(config.threads_per_row, 64) + 0.7 * steps(config.cta_threads, 256) +
         1.3 * steps(config.vec_bytes, 16) + 0.1 * persistent;
}

struct InjectedFailure {
  TrialStatus status;
  double bogus_median_us;  // what a broken evaluator might leave behind; must never win
};

class FakeEvaluator : public Evaluator {
 public:
  std::function<double(const Config&)> time_us = bowl_time_us;
  std::map<std::string, InjectedFailure> failures;  // by Config::key()
  int extra_trials = 0;                             // < 0 drops trials, > 0 repeats the last

  int calls = 0;
  std::int64_t last_rows = 0;
  Config last_reference;
  std::vector<Config> last_candidates;
  std::vector<std::vector<Config>> rounds;  // every call's candidates, in order

  std::vector<Trial> evaluate(const Family&, const Problem&, std::int64_t rows,
                              const Config& reference,
                              const std::vector<Config>& candidates) override {
    ++calls;
    last_rows = rows;
    last_reference = reference;
    last_candidates = candidates;
    rounds.push_back(candidates);
    std::vector<Trial> trials;
    for (const Config& config : candidates) {
      Trial trial;
      trial.config = config;
      trial.repetitions = 20 + calls;  // tells one call's trial from another's
      trial.compile_ms = 3.5;
      if (auto failure = failures.find(config.key()); failure != failures.end()) {
        trial.status = failure->second.status;
        trial.median_us = failure->second.bogus_median_us;
        trial.message = "injected " + std::string(trial_status_name(trial.status)) + " for " +
                        config.key() + "\nlog line two";
      } else {
        trial.median_us = time_us(config);
        trial.spread_us = trial.median_us / 100;
      }
      trials.push_back(trial);
    }
    if (extra_trials < 0)
      trials.resize(trials.size() - std::min<std::size_t>(-extra_trials, trials.size()));
    for (int i = 0; i < extra_trials && !trials.empty(); ++i) trials.push_back(trials.back());
    return trials;
  }
};

inline Problem fake_problem(std::int64_t hidden = 4096, DType dtype = DType::f32) {
  Problem problem;
  problem.dtype = dtype;
  problem.hidden = hidden;
  return problem;
}

inline Trial ok_trial(int tpr, double median_us) {
  Trial trial;
  trial.config = Config{16, tpr, 256, {}};
  trial.median_us = median_us;
  trial.repetitions = 10;
  return trial;
}

inline Trial failed_trial(int tpr, TrialStatus status, double bogus_median_us) {
  Trial trial = ok_trial(tpr, bogus_median_us);
  trial.status = status;
  trial.message = "failed";
  return trial;
}

}  // namespace kiln::testing
