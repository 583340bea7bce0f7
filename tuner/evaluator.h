// The tuner's only window onto hardware. jit/ implements it with NVRTC and the driver;
// tests implement it with a deterministic fake, so all search and selection logic runs
// without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "templates/family.h"

namespace kiln {

enum class TrialStatus : std::uint8_t {
  ok,
  compile_error,   // NVRTC rejected it
  resource_error,  // too many registers / shared memory for the launch
  launch_error,    // the launch or the run failed
  wrong_result,    // ran, but disagreed with the reference config's output
};

std::string_view trial_status_name(TrialStatus status);

struct Trial {
  Config config;
  TrialStatus status = TrialStatus::ok;
  double median_us = 0;   // valid when status == ok
  double spread_us = 0;   // interquartile range of the repetitions
  double compile_ms = 0;  // 0 when the binary came from the cache
  int repetitions = 0;
  std::string message;  // why it failed, with any log
};

class Evaluator {
 public:
  virtual ~Evaluator() = default;
  // Compiles every candidate (in parallel where it can), runs each on scratch buffers of
  // `rows` rows, checks its output against `reference`'s, and times it.
  // Returns one Trial per candidate, in the candidates' order. Never throws for a bad
  // candidate: failures are recorded in the trial.
  virtual std::vector<Trial> evaluate(const Family& family, const Problem& problem,
                                      std::int64_t rows, const Config& reference,
                                      const std::vector<Config>& candidates) = 0;
};

}  // namespace kiln
