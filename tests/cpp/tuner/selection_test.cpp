#include <doctest/doctest.h>

#include <limits>

#include "cache/error.h"
#include "fakes.h"
#include "tuner/tuner.h"

namespace kiln {

using testing::failed_trial;
using testing::ok_trial;

TEST_CASE("select_winner: no ok trial means no winner") {
  CHECK_FALSE(select_winner({}).has_value());
  CHECK_FALSE(select_winner({failed_trial(32, TrialStatus::compile_error, 1.0),
                             failed_trial(64, TrialStatus::launch_error, 2.0)})
                  .has_value());
}

TEST_CASE("select_winner: the fastest wins when the others are clearly slower") {
  CHECK(select_winner({ok_trial(32, 10.5), ok_trial(64, 10.0)}) == 1u);
  CHECK(select_winner({ok_trial(32, 12.0), ok_trial(64, 11.0), ok_trial(128, 10.0)}) == 2u);
  CHECK(select_winner({ok_trial(32, 10.0), ok_trial(64, 10.5)}) == 0u);
}

TEST_CASE("select_winner: within the tolerance the earlier trial wins") {
  // 0.5% apart: within the default 1%.
  CHECK(select_winner({ok_trial(32, 10.05), ok_trial(64, 10.0)}) == 0u);
  // 1.5% apart: outside it.
  CHECK(select_winner({ok_trial(32, 10.15), ok_trial(64, 10.0)}) == 1u);
  // Equal medians: the first.
  CHECK(select_winner({ok_trial(32, 10.0), ok_trial(64, 10.0)}) == 0u);
  // A slower earlier trial outside the tolerance does not take it from one inside it.
  CHECK(select_winner({ok_trial(16, 11.0), ok_trial(32, 10.05), ok_trial(64, 10.0)}) == 1u);
  // 5% apart: outside the default, inside a 10% tolerance.
  CHECK(select_winner({ok_trial(32, 10.5), ok_trial(64, 10.0)}) == 1u);
  CHECK(select_winner({ok_trial(32, 10.5), ok_trial(64, 10.0)}, 0.10) == 0u);
  // A zero tolerance is the plain minimum.
  CHECK(select_winner({ok_trial(32, 10.01), ok_trial(64, 10.0)}, 0.0) == 1u);
}

TEST_CASE("select_winner: failures never win, whatever median they carry") {
  for (TrialStatus status : {TrialStatus::compile_error, TrialStatus::resource_error,
                             TrialStatus::launch_error, TrialStatus::wrong_result}) {
    CAPTURE(trial_status_name(status));
    CHECK(select_winner({failed_trial(16, status, 0.001), ok_trial(32, 10.0)}) == 1u);
    CHECK(select_winner({ok_trial(32, 10.0), failed_trial(16, status, 0.001)}) == 0u);
    // A failure does not lower the bar the earlier-trial rule measures against.
    CHECK(select_winner({ok_trial(32, 10.0), failed_trial(16, status, 8.0), ok_trial(64, 9.95)}) ==
          0u);
  }
}

TEST_CASE("select_winner: an ok trial without a usable median cannot win") {
  double nan = std::numeric_limits<double>::quiet_NaN();
  double inf = std::numeric_limits<double>::infinity();
  CHECK(select_winner({ok_trial(16, nan), ok_trial(32, 10.0)}) == 1u);
  CHECK(select_winner({ok_trial(16, -1.0), ok_trial(32, 10.0)}) == 1u);
  CHECK(select_winner({ok_trial(16, inf), ok_trial(32, 10.0)}) == 1u);
  CHECK_FALSE(select_winner({ok_trial(16, nan)}).has_value());
}

TEST_CASE("select_winner: a tolerance must be a finite number >= 0") {
  CHECK_THROWS_AS(select_winner({ok_trial(32, 1.0)}, -0.01), ArgumentError);
  CHECK_THROWS_AS(select_winner({ok_trial(32, 1.0)}, std::numeric_limits<double>::quiet_NaN()),
                  ArgumentError);
}

}  // namespace kiln
