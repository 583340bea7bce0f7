// The whole tune: candidates, one evaluator call per round, the tie rule, and a sentence saying
// why.
#include "tuner/tuner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "cache/error.h"
#include "cache/log.h"
#include "tuner/measured.h"

namespace kiln {
namespace {

// Relative gap under which two medians are treated as equal: run-to-run noise on a quiet
// GPU, about 1%; see select_winner. At 2% the heuristic kept calls of 128 rows whose
// fastest candidate was 1.2-1.7% quicker (gated_residual on the H200), and those gaps
// showed beside torch.compile.
constexpr double kTieTolerance = 0.01;
constexpr std::size_t kMaxMessageChars = 200;

std::string format_number(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

std::string microseconds(double us) {
  return format_number("%.2f", us) + " us";
}

// A failure message may carry a whole compiler log; the reason keeps its first line.
std::string first_line(const std::string& message) {
  std::string line = message.substr(0, message.find('\n'));
  if (line.size() > kMaxMessageChars) {
    line = line.substr(0, kMaxMessageChars) + "...";
  }
  return line;
}

std::string failure(const Trial& trial) {
  std::string text = trial.config.key() + " " + std::string(trial_status_name(trial.status));
  if (trial.status == TrialStatus::ok) {
    text += " (median is not a usable time)";
  }
  if (!trial.message.empty()) {
    text += ": " + first_line(trial.message);
  }
  return text;
}

std::string all_failed_reason(const std::vector<Trial>& trials) {
  std::string reason =
      "every candidate failed (" + std::to_string(trials.size()) + "); the heuristic is kept";
  if (!trials.empty()) {
    reason += "; first failure: " + failure(trials.front());
  }
  return reason;
}

std::string winner_reason(const std::vector<Trial>& trials, std::size_t winner,
                          const Config& heuristic) {
  const Trial& won = trials[winner];
  std::size_t measured = std::count_if(trials.begin(), trials.end(), is_measured);
  double fastest = won.median_us;
  for (const Trial& trial : trials) {
    if (is_measured(trial)) {
      fastest = std::min(fastest, trial.median_us);
    }
  }

  std::string reason = won.config.key() + " fastest of " + std::to_string(trials.size()) + " (" +
                       microseconds(won.median_us);
  if (measured < trials.size()) {
    reason += "; " + std::to_string(trials.size() - measured) + " failed";
  }
  reason += ")";
  if (won.median_us > fastest) {
    reason += ", within " + format_number("%.0f", kTieTolerance * 100) + "% of the fastest (" +
              microseconds(fastest) + ") and earlier in order";
  }

  auto base = std::find_if(trials.begin(), trials.end(),
                           [&](const Trial& trial) { return trial.config == heuristic; });
  if (base == trials.end()) {
    return reason;
  }
  if (won.config == heuristic) {
    return reason + "; the heuristic itself";
  }
  if (!is_measured(*base)) {
    return reason + "; the heuristic failed (" + std::string(trial_status_name(base->status)) + ")";
  }
  std::string ratio =
      won.median_us > 0 ? format_number("%.2f", base->median_us / won.median_us) + "x" : "inf";
  return reason + "; " + ratio + " over heuristic (" + microseconds(base->median_us) + ")";
}

}  // namespace

TuneResult tune(const Family& family, const Problem& problem, std::int64_t rows,
                const DeviceTraits& device, TuneMode mode, Evaluator& evaluator) {
  auto start = std::chrono::steady_clock::now();
  auto elapsed_ms = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
  };
  family.check(problem);

  TuneResult result;
  result.problem = problem;
  result.bucket_rows = row_bucket(family, problem, rows);
  result.mode = mode;
  result.heuristic = reference_config(family, problem, device, rows);
  if (mode == TuneMode::off) {
    result.winner = result.heuristic;
    result.reason = "tuning off: heuristic";
    result.tune_ms = elapsed_ms();
    return result;
  }
  if (rows < 1) {
    throw ArgumentError(std::string(family.name()), "rows", "at least 1 row to tune on",
                        std::to_string(rows));
  }

  result.rows = rows;
  const std::string where = "kiln." + std::string(family.name()) + " tuner: " + problem.key();
  const auto measure = [&](const std::vector<Config>& configs) {
    std::vector<Trial> trials =
        evaluator.evaluate(family, problem, rows, result.heuristic, configs);
    if (trials.size() != configs.size()) {
      throw Error(where + ": expected the evaluator to return one trial per candidate (" +
                  std::to_string(configs.size()) + "), got " + std::to_string(trials.size()));
    }
    for (std::size_t i = 0; i < configs.size(); ++i) {
      if (trials[i].config != configs[i]) {
        throw Error(where + ": expected the evaluator's trial " + std::to_string(i) +
                    " to be for " + configs[i].key() + " (the candidates' order), got " +
                    trials[i].config.key());
      }
    }
    return trials;
  };
  const std::vector<Config> first = candidates(family, problem, device, mode, kFastBudget, rows);
  result.trials = measure(first);
  if (mode == TuneMode::fast) {
    if (auto best = select_winner(result.trials, kTieTolerance)) {
      // The first round's best is timed again beside its refinements, and that time replaces
      // its first: candidates are compared within one evaluation, never across two.
      std::vector<Config> second = refinement_candidates(
          family, problem, device, rows, result.trials[*best].config, first, kRefineBudget);
      if (!second.empty()) {
        second.insert(second.begin(), result.trials[*best].config);
        std::vector<Trial> trials = measure(second);
        result.trials[*best] = trials.front();
        result.trials.insert(result.trials.end(), trials.begin() + 1, trials.end());
      }
    }
  }

  if (auto winner = select_winner(result.trials, kTieTolerance)) {
    result.winner = result.trials[*winner].config;
    result.reason = winner_reason(result.trials, *winner, result.heuristic);
  } else {
    result.winner = result.heuristic;
    result.reason = all_failed_reason(result.trials);
  }
  result.tune_ms = elapsed_ms();
  log::info(where + " rows<=" + std::to_string(result.bucket_rows) + " (timed on " +
            std::to_string(rows) + "): " + result.reason);
  return result;
}

}  // namespace kiln
