#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "cache/error.h"
#include "fakes.h"
#include "tuner/tuner.h"

namespace kiln {
namespace {

using nlohmann::json;
using testing::fake_problem;
using testing::FakeEvaluator;
using testing::FakeFamily;
using testing::InjectedFailure;

bool same_time(double a, double b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

void check_same(const Trial& a, const Trial& b) {
  CHECK(a.config == b.config);
  CHECK(a.status == b.status);
  CHECK(same_time(a.median_us, b.median_us));
  CHECK(same_time(a.spread_us, b.spread_us));
  CHECK(same_time(a.compile_ms, b.compile_ms));
  CHECK(a.repetitions == b.repetitions);
  CHECK(a.message == b.message);
}

void check_same(const TuneResult& a, const TuneResult& b) {
  CHECK(a.problem == b.problem);
  CHECK(a.bucket_rows == b.bucket_rows);
  CHECK(a.rows == b.rows);
  CHECK(a.mode == b.mode);
  CHECK(a.heuristic == b.heuristic);
  CHECK(a.winner == b.winner);
  CHECK(same_time(a.tune_ms, b.tune_ms));
  CHECK(a.reason == b.reason);
  REQUIRE(a.trials.size() == b.trials.size());
  for (std::size_t i = 0; i < a.trials.size(); ++i) check_same(a.trials[i], b.trials[i]);
}

// A tuned result with extras and failures of several classes in it.
TuneResult sample_result() {
  FakeFamily family;
  family.with_extra = true;
  family.heuristic_config.extra["persistent"] = 0;
  FakeEvaluator evaluator;
  evaluator.failures[Config{16, 64, 128, {{"persistent", 0}}}.key()] =
      InjectedFailure{TrialStatus::wrong_result, 0.25};
  evaluator.failures[Config{16, 16, 128, {{"persistent", 0}}}.key()] =
      InjectedFailure{TrialStatus::resource_error, 0};
  Problem problem = fake_problem(1024, DType::bf16);
  problem.flags = 1;
  problem.align = 8;
  return tune(family, problem, 777, DeviceTraits{}, TuneMode::fast, evaluator);
}

TuneResult round_trip(const TuneResult& result) {
  json written = result;
  return json::parse(written.dump()).get<TuneResult>();
}

}  // namespace

TEST_CASE("tune result JSON: what to_json writes, from_json reads back unchanged") {
  TuneResult result = sample_result();
  REQUIRE(result.trials.size() > 2);
  REQUIRE(result.trials.front().config.extra.size() == 1);
  check_same(round_trip(result), result);

  TuneResult off;
  off.problem = fake_problem(4096);
  off.bucket_rows = 1;
  off.heuristic = off.winner = Config{8, 32, 256, {}};
  off.reason = "tuning off: heuristic";
  check_same(round_trip(off), off);
}

TEST_CASE("tune result JSON: the documented keys") {
  json j = sample_result();
  for (const char* key : {"problem", "bucket_rows", "rows", "mode", "heuristic", "winner", "reason",
                          "tune_ms", "trials"}) {
    CAPTURE(key);
    CHECK(j.contains(key));
  }
  CHECK(j.at("mode") == "fast");
  CHECK(j.at("bucket_rows") == 1024);
  CHECK(j.at("rows") == 777);
  REQUIRE(j.at("trials").is_array());
  for (const char* key :
       {"config", "status", "median_us", "spread_us", "compile_ms", "repetitions", "message"}) {
    CAPTURE(key);
    CHECK(j.at("trials").at(0).contains(key));
  }
  bool saw_wrong_result = false;
  for (const json& trial : j.at("trials")) saw_wrong_result |= trial.at("status") == "wrong_result";
  CHECK(saw_wrong_result);
}

TEST_CASE("tune result JSON: a time that is not a number survives the round trip") {
  TuneResult result = sample_result();
  result.trials[1].median_us = std::numeric_limits<double>::quiet_NaN();
  result.trials[1].spread_us = std::numeric_limits<double>::infinity();
  TuneResult back = round_trip(result);
  CHECK(std::isnan(back.trials[1].median_us));
  CHECK(std::isnan(back.trials[1].spread_us));
}

TEST_CASE("tune result JSON: a result without the rows it was timed on was timed on its bucket's") {
  json stored = sample_result();
  stored.erase("rows");
  const auto back = stored.get<TuneResult>();
  CHECK(back.bucket_rows == 1024);
  CHECK(back.rows == 1024);
}

TEST_CASE("tune result JSON: every missing key is an error naming it") {
  const json good = sample_result();
  for (const auto& item : good.items()) {
    const std::string& key = item.key();
    if (key == "rows") continue;  // optional (the test above)
    CAPTURE(key);
    json bad = good;
    bad.erase(key);
    try {
      bad.get<TuneResult>();
      FAIL("expected an Error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find(key) != std::string::npos);
    }
  }
  for (const auto& item : good.at("trials").at(0).items()) {
    const std::string& key = item.key();
    CAPTURE(key);
    json bad = good;
    bad["trials"][0].erase(key);
    CHECK_THROWS_AS(bad.get<TuneResult>(), Error);
  }
}

TEST_CASE("tune result JSON: bad names and types are errors") {
  const json good = sample_result();
  auto with = [&](auto change) {
    json bad = good;
    change(bad);
    return bad;
  };
  CHECK_THROWS_AS(with([](json& j) { j["trials"][0]["status"] = "slow"; }).get<TuneResult>(),
                  Error);
  CHECK_THROWS_AS(with([](json& j) { j["trials"][0]["status"] = 0; }).get<TuneResult>(), Error);
  CHECK_THROWS_AS(with([](json& j) { j["mode"] = "fastest"; }).get<TuneResult>(), Error);
  CHECK_THROWS_AS(with([](json& j) { j["bucket_rows"] = "1024"; }).get<TuneResult>(), Error);
  CHECK_THROWS_AS(with([](json& j) { j["trials"] = json::object(); }).get<TuneResult>(), Error);
  CHECK_THROWS_AS(with([](json& j) { j["trials"][0] = 3; }).get<TuneResult>(), Error);
  CHECK_THROWS_AS(with([](json& j) { j["winner"] = "v16.t32.c128"; }).get<TuneResult>(), Error);
  CHECK_THROWS_AS(json::array().get<TuneResult>(), Error);
  CHECK_THROWS_AS(json(nullptr).get<TuneResult>(), Error);
}

TEST_CASE("tune result JSON: a failed read leaves the target untouched") {
  TuneResult target = sample_result();
  const TuneResult before = target;
  json bad = target;
  bad["trials"][1]["status"] = "bogus";
  CHECK_THROWS_AS(from_json(bad, target), Error);
  check_same(target, before);
}

}  // namespace kiln
