#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "cache/error.h"
#include "fakes.h"
#include "tuner/tuner.h"

namespace kiln {
namespace {

using testing::bowl_time_us;
using testing::fake_problem;
using testing::FakeEvaluator;
using testing::FakeFamily;
using testing::InjectedFailure;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The space's fastest config by the fake's clock, found by brute force.
Config fastest_in(const std::vector<Config>& configs) {
  return *std::min_element(configs.begin(), configs.end(), [](const Config& a, const Config& b) {
    return bowl_time_us(a) < bowl_time_us(b);
  });
}

}  // namespace

TEST_CASE("tune off: the heuristic, with no evaluator call") {
  FakeFamily family;
  FakeEvaluator evaluator;
  TuneResult result =
      tune(family, fake_problem(1024), 300, DeviceTraits{}, TuneMode::off, evaluator);
  CHECK(evaluator.calls == 0);
  CHECK(result.mode == TuneMode::off);
  CHECK(result.problem == fake_problem(1024));
  CHECK(result.bucket_rows == 512);
  CHECK(result.heuristic == family.heuristic_config);
  CHECK(result.winner == family.heuristic_config);
  CHECK(result.trials.empty());
  CHECK(contains(result.reason, "tuning off"));
  CHECK(result.tune_ms >= 0);
}

TEST_CASE("tune off accepts zero rows; a measured tune needs at least one") {
  FakeFamily family;
  FakeEvaluator evaluator;
  CHECK(tune(family, fake_problem(1024), 0, DeviceTraits{}, TuneMode::off, evaluator).bucket_rows ==
        1);
  CHECK_THROWS_AS(tune(family, fake_problem(1024), 0, DeviceTraits{}, TuneMode::fast, evaluator),
                  ArgumentError);
  CHECK(evaluator.calls == 0);
}

TEST_CASE("tune rejects a problem the family cannot specialise") {
  FakeFamily family;
  FakeEvaluator evaluator;
  CHECK_THROWS_AS(tune(family, fake_problem(0), 8, DeviceTraits{}, TuneMode::full, evaluator),
                  ArgumentError);
}

TEST_CASE("tune full: every config measured once, the fastest wins") {
  FakeFamily family;
  FakeEvaluator evaluator;
  Problem problem = fake_problem(1024);
  auto space = family.space(problem, DeviceTraits{});
  TuneResult result = tune(family, problem, 3000, DeviceTraits{}, TuneMode::full, evaluator);

  CHECK(evaluator.calls == 1);
  CHECK(evaluator.last_candidates == space);
  CHECK(evaluator.last_rows == 3000);
  CHECK(evaluator.last_reference == family.heuristic_config);
  CHECK(result.trials.size() == space.size());
  CHECK(result.bucket_rows == 4096);
  CHECK(result.rows == 3000);
  CHECK(result.mode == TuneMode::full);
  CHECK(result.winner == fastest_in(space));
  CHECK(result.winner == Config{16, 64, 256, {}});
  CHECK(contains(result.reason, "fastest of " + std::to_string(space.size())));
  CHECK(contains(result.reason, "over heuristic"));
}

TEST_CASE("tune fast: two rounds, the second around the first's winner; the fastest wins") {
  FakeFamily family;
  FakeEvaluator evaluator;
  Problem problem = fake_problem(1024);
  TuneResult result = tune(family, problem, 3000, DeviceTraits{}, TuneMode::fast, evaluator);
  REQUIRE(evaluator.calls == 2);
  const std::vector<Config> first =
      candidates(family, problem, DeviceTraits{}, TuneMode::fast, kFastBudget, 3000);
  CHECK(evaluator.rounds[0] == first);
  CHECK(result.trials.front().config == family.heuristic_config);
  // The second round times the first round's fastest again, then its refinements, none of
  // which the first round measured; the fastest keeps one trial, its second.
  const Config first_best = fastest_in(first);
  REQUIRE(!evaluator.rounds[1].empty());
  CHECK(evaluator.rounds[1].front() == first_best);
  const std::vector<Config> refinements(evaluator.rounds[1].begin() + 1, evaluator.rounds[1].end());
  CHECK(refinements == refinement_candidates(family, problem, DeviceTraits{}, 3000, first_best,
                                             first, kRefineBudget));
  CHECK(refinements.size() <= kRefineBudget);
  for (const Config& config : refinements) {
    CHECK(std::find(first.begin(), first.end(), config) == first.end());
  }
  CHECK(result.trials.size() == first.size() + refinements.size());
  const auto is_first_best = [&](const Trial& trial) { return trial.config == first_best; };
  CHECK(std::count_if(result.trials.begin(), result.trials.end(), is_first_best) == 1);
  CHECK(std::find_if(result.trials.begin(), result.trials.end(), is_first_best)->repetitions ==
        20 + 2);
  std::vector<Config> measured;
  for (const Trial& trial : result.trials) measured.push_back(trial.config);
  CHECK(result.winner == fastest_in(measured));
  CHECK(bowl_time_us(result.winner) <= bowl_time_us(first_best));
  CHECK(bowl_time_us(result.winner) < bowl_time_us(family.heuristic_config));
}

TEST_CASE("tune fast: no second round when every first-round candidate failed") {
  FakeFamily family;
  FakeEvaluator evaluator;
  Problem problem = fake_problem(1024);
  for (const Config& config :
       candidates(family, problem, DeviceTraits{}, TuneMode::fast, kFastBudget, 3000))
    evaluator.failures[config.key()] = InjectedFailure{TrialStatus::launch_error, 0};
  TuneResult result = tune(family, problem, 3000, DeviceTraits{}, TuneMode::fast, evaluator);
  CHECK(evaluator.calls == 1);
  CHECK(result.winner == family.heuristic_config);
}

TEST_CASE("tune is deterministic") {
  FakeFamily family;
  family.with_extra = true;
  family.heuristic_config.extra["persistent"] = 0;
  Problem problem = fake_problem(2048);
  for (TuneMode mode : {TuneMode::fast, TuneMode::full}) {
    FakeEvaluator first, second;
    TuneResult a = tune(family, problem, 700, DeviceTraits{}, mode, first);
    TuneResult b = tune(family, problem, 700, DeviceTraits{}, mode, second);
    CHECK(first.last_candidates == second.last_candidates);
    CHECK(a.winner == b.winner);
    CHECK(a.reason == b.reason);
    CHECK(a.trials.size() == b.trials.size());
  }
}

TEST_CASE("tune: within 1% the earlier candidate (the heuristic) keeps the win") {
  FakeFamily family;
  Problem problem = fake_problem(1024);
  const Config rival{16, 64, 128, {}};
  for (double rival_us : {99.2, 98.5, 95.0}) {
    CAPTURE(rival_us);
    FakeEvaluator evaluator;
    evaluator.time_us = [&](const Config& config) {
      if (config == family.heuristic_config) return 100.0;
      if (config == rival) return rival_us;
      return 200.0;
    };
    TuneResult result = tune(family, problem, 512, DeviceTraits{}, TuneMode::fast, evaluator);
    REQUIRE(evaluator.rounds.at(0).front() == family.heuristic_config);
    REQUIRE(std::find(evaluator.rounds[0].begin(), evaluator.rounds[0].end(), rival) !=
            evaluator.rounds[0].end());
    if (rival_us == 99.2) {
      CHECK(result.winner == family.heuristic_config);
      CHECK(contains(result.reason, "within 1% of the fastest"));
    } else {
      CHECK(result.winner == rival);
      CHECK(contains(result.reason,
                     rival_us == 95.0 ? "1.05x over heuristic" : "1.02x over heuristic"));
    }
  }
}

TEST_CASE("tune: failures of every class are recorded and never win") {
  FakeFamily family;
  Problem problem = fake_problem(1024);
  // The four configs nearest the bowl's minimum fail, each with a bogus, tiny median.
  const std::vector<std::pair<Config, TrialStatus>> broken = {
      {{16, 64, 256, {}}, TrialStatus::compile_error},
      {{16, 32, 256, {}}, TrialStatus::resource_error},
      {{16, 128, 256, {}}, TrialStatus::launch_error},
      {{16, 64, 128, {}}, TrialStatus::wrong_result},
  };
  FakeEvaluator evaluator;
  for (const auto& [config, status] : broken) {
    evaluator.failures[config.key()] = InjectedFailure{status, 0.001};
  }
  TuneResult result = tune(family, problem, 4096, DeviceTraits{}, TuneMode::full, evaluator);

  for (const auto& entry : broken) {
    // Named, not structured bindings: clang before 16 cannot capture those in lambdas.
    const Config& config = entry.first;
    const TrialStatus status = entry.second;
    CAPTURE(config.key());
    auto trial = std::find_if(result.trials.begin(), result.trials.end(),
                              [&](const Trial& t) { return t.config == config; });
    REQUIRE(trial != result.trials.end());
    CHECK(trial->status == status);
    CHECK(contains(trial->message, std::string(trial_status_name(status))));
    CHECK(result.winner != config);
  }
  std::vector<Config> healthy;
  for (const Config& config : family.space(problem, DeviceTraits{})) {
    if (!evaluator.failures.count(config.key())) healthy.push_back(config);
  }
  CHECK(result.winner == fastest_in(healthy));
  CHECK(contains(result.reason, "4 failed"));
}

TEST_CASE("tune: when every candidate fails the heuristic is kept, and the reason says why") {
  FakeFamily family;
  Problem problem = fake_problem(1024);
  FakeEvaluator evaluator;
  for (const Config& config :
       candidates(family, problem, DeviceTraits{}, TuneMode::fast, kFastBudget, 64)) {
    evaluator.failures[config.key()] = InjectedFailure{TrialStatus::compile_error, 0.5};
  }
  TuneResult result = tune(family, problem, 64, DeviceTraits{}, TuneMode::fast, evaluator);
  CHECK(evaluator.calls == 1);
  CHECK(result.winner == family.heuristic_config);
  CHECK(!result.trials.empty());
  CHECK(contains(result.reason, "every candidate failed"));
  CHECK(contains(result.reason, "injected compile_error for " + family.heuristic_config.key()));
  CHECK_FALSE(contains(result.reason, "log line two"));
}

TEST_CASE("tune: an evaluator returning the wrong number of trials is an error") {
  FakeFamily family;
  for (int extra : {-1, 1}) {
    CAPTURE(extra);
    FakeEvaluator evaluator;
    evaluator.extra_trials = extra;
    CHECK_THROWS_AS(
        tune(family, fake_problem(1024), 100, DeviceTraits{}, TuneMode::fast, evaluator), Error);
  }
}

TEST_CASE("tune: an evaluator returning trials out of order is an error") {
  FakeFamily family;
  class Reversing : public FakeEvaluator {
    std::vector<Trial> evaluate(const Family& f, const Problem& p, std::int64_t rows,
                                const Config& reference,
                                const std::vector<Config>& configs) override {
      auto trials = FakeEvaluator::evaluate(f, p, rows, reference, configs);
      std::reverse(trials.begin(), trials.end());
      return trials;
    }
  } evaluator;
  CHECK_THROWS_AS(tune(family, fake_problem(1024), 100, DeviceTraits{}, TuneMode::fast, evaluator),
                  Error);
}

}  // namespace kiln
