#include <doctest/doctest.h>

#include <set>
#include <string>

#include "tuner/tuner.h"

namespace kiln {

TEST_CASE("trial status names are the documented, distinct spellings") {
  CHECK(trial_status_name(TrialStatus::ok) == "ok");
  CHECK(trial_status_name(TrialStatus::compile_error) == "compile_error");
  CHECK(trial_status_name(TrialStatus::resource_error) == "resource_error");
  CHECK(trial_status_name(TrialStatus::launch_error) == "launch_error");
  CHECK(trial_status_name(TrialStatus::wrong_result) == "wrong_result");
}

TEST_CASE("tune modes parse from their names and nothing else") {
  for (TuneMode mode : {TuneMode::off, TuneMode::fast, TuneMode::full}) {
    auto parsed = parse_tune_mode(tune_mode_name(mode));
    REQUIRE(parsed.has_value());
    CHECK(*parsed == mode);
  }
  CHECK(parse_tune_mode("off") == TuneMode::off);
  CHECK(parse_tune_mode("fast") == TuneMode::fast);
  CHECK(parse_tune_mode("full") == TuneMode::full);
  for (const char* bad : {"", "FAST", "on", "ful", "fast ", "none"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_tune_mode(bad).has_value());
  }
}

}  // namespace kiln
