#include "tuner/replay.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "cache/error.h"
#include "tuner/measured.h"

namespace kiln {

ReplayEvaluator::ReplayEvaluator(const std::vector<Trial>& recorded) {
  for (const Trial& trial : recorded) {
    by_key_.emplace(trial.config.key(), trial);
  }
}

std::vector<Trial> ReplayEvaluator::evaluate(const Family&, const Problem&, std::int64_t,
                                             const Config&, const std::vector<Config>& candidates) {
  std::vector<Trial> trials;
  trials.reserve(candidates.size());
  for (const Config& config : candidates) {
    auto found = by_key_.find(config.key());
    if (found != by_key_.end()) {
      trials.push_back(found->second);
      continue;
    }
    Trial trial;
    trial.config = config;
    trial.status = TrialStatus::launch_error;
    trial.message = "not in the recorded tune";
    trials.push_back(trial);
    ++unknown_;
  }
  return trials;
}

namespace {

// `config`'s measured time in `recorded`; 0 where it has none.
double recorded_us(const TuneResult& recorded, const Config& config) {
  auto found = std::find_if(recorded.trials.begin(), recorded.trials.end(),
                            [&](const Trial& trial) { return trial.config == config; });
  return found != recorded.trials.end() && is_measured(*found) ? found->median_us : 0;
}

}  // namespace

ReplayOutcome replay_fast_tune(const Family& family, const TuneResult& recorded,
                               const DeviceTraits& device) {
  const std::string where =
      "kiln replay of " + recorded.problem.key() + ".r" + std::to_string(recorded.bucket_rows);
  if (recorded.mode != TuneMode::full) {
    throw Error(where + ": expected a full tune, got mode " +
                std::string(tune_mode_name(recorded.mode)));
  }
  // The whole space's fastest: the tie rule with no tolerance.
  const std::optional<std::size_t> best = select_winner(recorded.trials, 0.0);
  if (!best) {
    throw Error(where + ": expected at least one measured trial, got none of " +
                std::to_string(recorded.trials.size()));
  }

  ReplayEvaluator evaluator(recorded.trials);
  const std::int64_t rows = recorded.timed_rows();
  const TuneResult fast = tune(family, recorded.problem, rows, device, TuneMode::fast, evaluator);
  const double won_us = recorded_us(recorded, fast.winner);
  if (won_us <= 0) {
    // Only when every candidate failed: the search fell back to a config with no time.
    throw Error(where + ": the fast search chose " + fast.winner.key() +
                ", which the recording holds no time for (" + fast.reason + ")");
  }
  ReplayOutcome outcome;
  outcome.problem = recorded.problem;
  outcome.bucket_rows = recorded.bucket_rows;
  outcome.rows = rows;
  outcome.fast_winner = fast.winner;
  outcome.fast_us = won_us;
  outcome.best = recorded.trials[*best].config;
  outcome.best_us = recorded.trials[*best].median_us;
  outcome.measured = fast.trials.size();
  outcome.unknown = evaluator.unknown();
  outcome.heuristic = fast.heuristic;
  outcome.heuristic_us = recorded_us(recorded, fast.heuristic);
  return outcome;
}

DeviceTraits recorded_device_traits(const nlohmann::json& device) {
  DeviceTraits traits = DeviceTraits::for_arch(device.at("sm").get<int>());
  traits.sm_count = device.at("sm_count").get<int>();
  traits.l2_bytes = device.at("l2_bytes").get<std::int64_t>();
  return traits;
}

namespace {

double geomean_of(const std::vector<ReplayOutcome>& outcomes,
                  double (ReplayOutcome::*cost)() const) {
  double logs = 0;
  std::size_t counted = 0;
  for (const ReplayOutcome& outcome : outcomes) {
    if (const double value = (outcome.*cost)(); value > 0) {
      logs += std::log(value);
      ++counted;
    }
  }
  return counted == 0 ? 0 : std::exp(logs / static_cast<double>(counted));
}

double worst_of(const std::vector<ReplayOutcome>& outcomes, double (ReplayOutcome::*cost)() const) {
  double worst = 0;
  for (const ReplayOutcome& outcome : outcomes) {
    worst = std::max(worst, (outcome.*cost)());
  }
  return worst;
}

std::size_t count_over(const std::vector<ReplayOutcome>& outcomes,
                       double (ReplayOutcome::*cost)() const, double bound) {
  return static_cast<std::size_t>(
      std::count_if(outcomes.begin(), outcomes.end(),
                    [&](const ReplayOutcome& outcome) { return (outcome.*cost)() > bound; }));
}

}  // namespace

double ReplaySummary::geomean_cost() const {
  return geomean_of(outcomes, &ReplayOutcome::cost);
}

double ReplaySummary::worst_cost() const {
  return worst_of(outcomes, &ReplayOutcome::cost);
}

std::size_t ReplaySummary::costing_more_than(double cost) const {
  return count_over(outcomes, &ReplayOutcome::cost, cost);
}

double ReplaySummary::heuristic_geomean_cost() const {
  return geomean_of(outcomes, &ReplayOutcome::heuristic_cost);
}

double ReplaySummary::heuristic_worst_cost() const {
  return worst_of(outcomes, &ReplayOutcome::heuristic_cost);
}

std::size_t ReplaySummary::heuristic_costing_more_than(double cost) const {
  return count_over(outcomes, &ReplayOutcome::heuristic_cost, cost);
}

ReplaySummary replay_documents(const std::vector<report::StoredDocument>& documents,
                               const report::Filter& filter) {
  if (!filter.op.empty() && !parse_op(filter.op)) {
    throw ArgumentError("tune replay", "op", "a known op name", "'" + filter.op + "'");
  }
  ReplaySummary summary;
  for (const report::StoredDocument& stored : documents) {
    const std::string name =
        stored.device + "/" + stored.problem + ".r" + std::to_string(stored.bucket);
    if (!filter.device.empty() && !report::device_matches(stored, filter.device)) {
      continue;
    }
    if (stored.document.is_discarded()) {
      summary.skipped.push_back(name + ": not readable JSON");
      continue;
    }
    try {
      const TuneResult recorded = stored.document.get<TuneResult>();
      if (!filter.op.empty() && op_name(recorded.problem.op) != filter.op) {
        continue;
      }
      if (recorded.mode != TuneMode::full) {
        summary.skipped.push_back(name + ": a " + std::string(tune_mode_name(recorded.mode)) +
                                  " tune (only full tunes hold every config's time)");
        continue;
      }
      summary.outcomes.push_back(
          replay_fast_tune(family(recorded.problem.op), recorded,
                           recorded_device_traits(stored.document.at("device"))));
    } catch (const std::exception& error) {
      summary.skipped.push_back(name + ": " + error.what());
    }
  }
  return summary;
}

std::string render_replay(const ReplaySummary& summary) {
  std::string text;
  char line[512];
  for (const ReplayOutcome& o : summary.outcomes) {
    // The bucket, and the rows timed where they are not the bucket's.
    std::string rows = "r";
    rows += std::to_string(o.bucket_rows);
    if (o.rows != o.bucket_rows) {
      rows += '@';
      rows += std::to_string(o.rows);
    }
    char heuristic[32] = "untimed";
    if (o.heuristic_us > 0) {
      std::snprintf(heuristic, sizeof heuristic, "%.3fx", o.heuristic_cost());
    }
    std::snprintf(line, sizeof line,
                  "%-44s %-12s fast %-30s %9.2f us  best %-30s %9.2f us  %.3fx  (%zu measured%s)  "
                  "heuristic %s %s\n",
                  o.problem.key().c_str(), rows.c_str(), o.fast_winner.key().c_str(), o.fast_us,
                  o.best.key().c_str(), o.best_us, o.cost(), o.measured,
                  o.unknown > 0 ? (", " + std::to_string(o.unknown) + " unknown").c_str() : "",
                  o.heuristic.key().c_str(), heuristic);
    text += line;
  }
  for (const std::string& skipped : summary.skipped) {
    text += "skipped " + skipped + "\n";
  }
  std::snprintf(line, sizeof line,
                "%zu full tune%s replayed: the fast search's choice costs %.4fx the best on "
                "geometric mean, %.3fx at worst; %zu over 1.01x, %zu over 1.02x\n",
                summary.outcomes.size(), summary.outcomes.size() == 1 ? "" : "s",
                summary.geomean_cost(), summary.worst_cost(), summary.costing_more_than(1.01),
                summary.costing_more_than(1.02));
  text += line;
  if (summary.heuristic_geomean_cost() == 0) {
    return text;  // no outcome whose heuristic has a recorded time
  }
  std::snprintf(line, sizeof line,
                "the heuristic (what tuning off, a strict miss and a capture run) costs %.4fx "
                "on geometric mean, %.3fx at worst; %zu over 1.05x, %zu over 1.2x\n",
                summary.heuristic_geomean_cost(), summary.heuristic_worst_cost(),
                summary.heuristic_costing_more_than(1.05),
                summary.heuristic_costing_more_than(1.2));
  text += line;
  return text;
}

}  // namespace kiln
