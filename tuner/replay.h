// Replaying the fast search against a recorded full tune: the evaluator answers every
// candidate with the time the full tune measured for it, so how close the fast search comes to
// the whole space's best can be judged, and its strategy changed, without a GPU.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "templates/family.h"
#include "tuner/evaluator.h"
#include "tuner/report.h"
#include "tuner/tuner.h"

namespace kiln {

// Answers from a recorded tune's trials, by config. A candidate the recording does not hold
// (the space has changed since it was measured) comes back as a launch_error saying so.
class ReplayEvaluator : public Evaluator {
 public:
  explicit ReplayEvaluator(const std::vector<Trial>& recorded);
  std::vector<Trial> evaluate(const Family& family, const Problem& problem, std::int64_t rows,
                              const Config& reference,
                              const std::vector<Config>& candidates) override;
  std::size_t unknown() const { return unknown_; }

 private:
  std::map<std::string, Trial> by_key_;
  std::size_t unknown_ = 0;
};

struct ReplayOutcome {
  Problem problem;
  std::int64_t bucket_rows = 0;
  std::int64_t rows = 0;  // timed on
  Config fast_winner;
  double fast_us = 0;  // the recorded time of the fast search's winner
  Config best;         // the recording's fastest measured config
  double best_us = 0;
  std::size_t measured = 0;  // candidates the fast search asked for
  std::size_t unknown = 0;   // of them, not in the recording
  // What KILN_TUNE=off, a strict cache miss and a capture fall back to for these rows.
  Config heuristic;
  double heuristic_us = 0;  // its recorded time; 0 where the recording has none
  // How much slower the fast search's choice is than the best (1 = it found the best).
  double cost() const { return best_us > 0 ? fast_us / best_us : 0; }
  // The same for the heuristic; 0 where it has no recorded time.
  double heuristic_cost() const { return best_us > 0 ? heuristic_us / best_us : 0; }
};

// Runs tune(..., TuneMode::fast) on `recorded`'s problem and rows, answered from
// `recorded` (which must be a full tune with at least one measured trial). Throws where the
// search's choice has no recorded time (every candidate it asked for was unknown or failed).
ReplayOutcome replay_fast_tune(const Family& family, const TuneResult& recorded,
                               const DeviceTraits& device);

// The traits a tuning document's "device" object (jit/tuning_record.h) implies: the arch's
// typical traits (DeviceTraits::for_arch) with its recorded SM count and L2 size.
DeviceTraits recorded_device_traits(const nlohmann::json& device);

// Every full tune among `documents` that `filter` selects, replayed; the rest (other modes,
// unreadable documents) are listed in `skipped` with the reason.
struct ReplaySummary {
  std::vector<ReplayOutcome> outcomes;
  std::vector<std::string> skipped;
  double geomean_cost() const;
  double worst_cost() const;
  std::size_t costing_more_than(double cost) const;
  // The same over the outcomes whose heuristic has a recorded time.
  double heuristic_geomean_cost() const;
  double heuristic_worst_cost() const;
  std::size_t heuristic_costing_more_than(double cost) const;
};
ReplaySummary replay_documents(const std::vector<report::StoredDocument>& documents,
                               const report::Filter& filter);

// One line per outcome (problem, bucket, fast and best configs with their times, the cost,
// the heuristic's cost), then the summary.
std::string render_replay(const ReplaySummary& summary);

}  // namespace kiln
