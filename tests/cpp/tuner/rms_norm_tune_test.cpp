// The tuner over the real RMSNorm family's spaces, with the fake evaluator for timings.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "fakes.h"
#include "templates/rms_norm_family.h"
#include "tuner/tuner.h"

namespace kiln {
namespace {

using testing::bowl_time_us;
using testing::FakeEvaluator;

Problem rms_problem(DType dtype, std::int64_t hidden, std::uint32_t align = 16) {
  Problem problem;
  problem.op = Op::rms_norm;
  problem.dtype = dtype;
  problem.hidden = hidden;
  problem.flags = kRmsNormHasWeight;
  problem.align = align;
  return problem;
}

}  // namespace

TEST_CASE("rms_norm: fast candidates are few, unique, the search start first, within the space") {
  RmsNormFamily family;
  for (int sm : {75, 80, 90}) {
    DeviceTraits device = DeviceTraits::for_arch(sm);
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      for (std::int64_t hidden : {1, 128, 1000, 2048, 4096, 5120, 8192, 65536}) {
        for (std::int64_t rows : {0, 1, 7, 100, 4096, 100000}) {
          Problem problem = rms_problem(dtype, hidden);
          CAPTURE(sm);
          CAPTURE(problem.key());
          CAPTURE(rows);
          auto space = family.space(problem, device);
          auto chosen = candidates(family, problem, device, TuneMode::fast, kFastBudget, rows);
          REQUIRE(!chosen.empty());
          CHECK(chosen.size() <= 8);
          CHECK(chosen.front() ==
                (rows > 0
                     ? family.heuristic_for_rows(problem, device, row_bucket(family, problem, rows))
                     : family.heuristic(problem, device)));
          std::set<std::string> keys;
          for (const Config& config : chosen) {
            CHECK(keys.insert(config.key()).second);
            CHECK(std::find(space.begin(), space.end(), config) != space.end());
          }
          CHECK(chosen == candidates(family, problem, device, TuneMode::fast, kFastBudget, rows));
          CHECK(candidates(family, problem, device, TuneMode::full, 8, rows) == space);
        }
      }
    }
  }
}

TEST_CASE(
    "rms_norm: the search starts at the heuristic from more rows than SMs, and at more "
    "threads per row below") {
  RmsNormFamily family;
  const DeviceTraits h200 = DeviceTraits::for_arch(90);
  for (std::int64_t hidden : {1536, 2432, 3072, 4096, 4544, 5120, 8192, 14848}) {
    const Problem problem = rms_problem(DType::bf16, hidden);
    CAPTURE(problem.key());
    const Config heuristic = family.heuristic(problem, h200);
    CHECK(candidates(family, problem, h200, TuneMode::fast, kFastBudget, 2688).front() ==
          heuristic);
    CHECK(candidates(family, problem, h200, TuneMode::fast, kFastBudget, 0).front() == heuristic);
    for (std::int64_t rows : {1, 128}) {
      CAPTURE(rows);
      const Config start =
          candidates(family, problem, h200, TuneMode::fast, kFastBudget, rows).front();
      // One row per CTA, split finer than the bandwidth layout: at most 16 elements a thread
      // where the widest rows allow it.
      CHECK(start.cta_threads == start.threads_per_row);
      CHECK(start.threads_per_row >= heuristic.threads_per_row);
      CHECK(RmsNormFamily::elements_per_thread(problem, start) <=
            std::max<std::int64_t>(16, RmsNormFamily::elements_per_thread(problem, heuristic) / 2));
    }
  }
}

TEST_CASE("rms_norm: a large space is cut to the budget and the fast search spans vector widths") {
  RmsNormFamily family;
  DeviceTraits device = DeviceTraits::for_arch(90);
  Problem problem = rms_problem(DType::bf16, 4096);
  REQUIRE(family.space(problem, device).size() > 8);
  auto chosen = candidates(family, problem, device, TuneMode::fast, kFastBudget, 4096);
  CHECK(chosen.size() == 8);
  // The first round measures the heuristic's neighbours and its shape's extras (persistent
  // grids, a re-read row) before narrower vectors; the second, around the first's winner
  // (here the heuristic), takes the next narrower width.
  const auto second =
      refinement_candidates(family, problem, device, 4096, chosen.front(), chosen, kRefineBudget);
  std::set<int> widths;
  for (const Config& config : chosen) widths.insert(config.vec_bytes);
  for (const Config& config : second) widths.insert(config.vec_bytes);
  CHECK(widths.size() > 1);
}

TEST_CASE("rms_norm: a full tune picks the fastest and its result survives JSON") {
  RmsNormFamily family;
  DeviceTraits device = DeviceTraits::for_arch(80);
  Problem problem = rms_problem(DType::f16, 2048, 8);
  FakeEvaluator evaluator;
  TuneResult result = tune(family, problem, 1500, device, TuneMode::full, evaluator);
  auto space = family.space(problem, device);
  REQUIRE(result.trials.size() == space.size());
  Config fastest = *std::min_element(space.begin(), space.end(), [](auto& a, auto& b) {
    return bowl_time_us(a) < bowl_time_us(b);
  });
  CHECK(bowl_time_us(result.winner) <= bowl_time_us(fastest) * 1.02);
  CHECK(result.bucket_rows == 2048);

  TuneResult back = nlohmann::json::parse(nlohmann::json(result).dump()).get<TuneResult>();
  CHECK(back.problem == result.problem);
  CHECK(back.winner == result.winner);
  CHECK(back.heuristic == result.heuristic);
  CHECK(back.trials.size() == result.trials.size());
}

}  // namespace kiln
