// The tie rule. Timings of configs this close are within run-to-run noise, so preferring the
// earlier one (the family's canonical order, with the heuristic first in fast mode) keeps the
// choice stable across runs and machines instead of flipping on noise.
#include <cmath>
#include <string>

#include "cache/error.h"
#include "tuner/measured.h"
#include "tuner/tuner.h"

namespace kiln {

std::optional<std::size_t> select_winner(const std::vector<Trial>& trials, double tolerance) {
  if (!(tolerance >= 0) || !std::isfinite(tolerance)) {
    throw ArgumentError("tuner", "tolerance", "a finite number >= 0", std::to_string(tolerance));
  }
  std::optional<double> fastest;
  for (const Trial& trial : trials) {
    if (is_measured(trial) && (!fastest || trial.median_us < *fastest)) fastest = trial.median_us;
  }
  if (!fastest) return std::nullopt;
  double limit = *fastest * (1 + tolerance);
  for (std::size_t i = 0; i < trials.size(); ++i) {
    if (is_measured(trials[i]) && trials[i].median_us <= limit) return i;
  }
  return std::nullopt;  // unreachable: the fastest trial itself is within the limit
}

}  // namespace kiln
