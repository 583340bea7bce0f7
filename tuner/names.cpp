#include <array>

#include "tuner/evaluator.h"
#include "tuner/tuner.h"

namespace kiln {
namespace {

constexpr std::array<TuneMode, 3> kModes = {TuneMode::off, TuneMode::fast, TuneMode::full};

}  // namespace

std::string_view trial_status_name(TrialStatus status) {
  switch (status) {
    case TrialStatus::ok:
      return "ok";
    case TrialStatus::compile_error:
      return "compile_error";
    case TrialStatus::resource_error:
      return "resource_error";
    case TrialStatus::launch_error:
      return "launch_error";
    case TrialStatus::wrong_result:
      return "wrong_result";
  }
  return "?";
}

std::string_view tune_mode_name(TuneMode mode) {
  switch (mode) {
    case TuneMode::off:
      return "off";
    case TuneMode::fast:
      return "fast";
    case TuneMode::full:
      return "full";
  }
  return "?";
}

std::optional<TuneMode> parse_tune_mode(std::string_view text) {
  for (TuneMode mode : kModes) {
    if (text == tune_mode_name(mode)) return mode;
  }
  return std::nullopt;
}

}  // namespace kiln
