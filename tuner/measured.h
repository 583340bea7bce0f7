// Which trials the selection may compare.
#pragma once

#include <cmath>

#include "tuner/evaluator.h"

namespace kiln {

// An ok trial whose median is not a finite, non-negative time (an evaluator's bug) cannot be
// compared with the others, so it counts as a failure.
inline bool is_measured(const Trial& trial) {
  return trial.status == TrialStatus::ok && std::isfinite(trial.median_us) && trial.median_us >= 0;
}

}  // namespace kiln
