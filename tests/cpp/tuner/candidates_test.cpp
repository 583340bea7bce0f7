#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "cache/error.h"
#include "fakes.h"
#include "tuner/tuner.h"

namespace kiln {
namespace {

using testing::fake_problem;
using testing::FakeFamily;

bool contains(const std::vector<Config>& configs, const Config& config) {
  return std::find(configs.begin(), configs.end(), config) != configs.end();
}

void check_unique_subset(const std::vector<Config>& chosen, const std::vector<Config>& space) {
  std::set<std::string> keys;
  for (const Config& config : chosen) {
    CAPTURE(config.key());
    CHECK(keys.insert(config.key()).second);
    CHECK(contains(space, config));
  }
}

// The space configs whose share of a row fits in 64 floats per thread, in space order.
std::vector<Config> register_friendly(const std::vector<Config>& space, std::int64_t hidden) {
  std::vector<Config> kept;
  for (const Config& config : space) {
    if ((hidden + config.threads_per_row - 1) / config.threads_per_row <= 64) {
      kept.push_back(config);
    }
  }
  return kept;
}

}  // namespace

TEST_CASE("candidates: mode off is the heuristic alone") {
  FakeFamily family;
  auto chosen = candidates(family, fake_problem(1024), DeviceTraits{}, TuneMode::off);
  REQUIRE(chosen.size() == 1);
  CHECK(chosen[0] == family.heuristic_config);
}

TEST_CASE("candidates: mode full is the whole space in canonical order") {
  FakeFamily family;
  family.with_extra = true;
  family.heuristic_config.extra["persistent"] = 1;
  Problem problem = fake_problem(4096);
  auto space = family.space(problem, DeviceTraits{});
  auto chosen = candidates(family, problem, DeviceTraits{}, TuneMode::full, 8, 100);
  CHECK(chosen.size() == space.size());
  CHECK(chosen == space);
}

TEST_CASE("candidates: fast mode stays within its budget, heuristic first, unique, in space") {
  FakeFamily family;
  DeviceTraits device;
  for (bool with_extra : {false, true}) {
    family.with_extra = with_extra;
    family.heuristic_config = Config{16, 32, 128, {}};
    if (with_extra) family.heuristic_config.extra["persistent"] = 0;
    for (std::int64_t hidden : {1024, 4096, 768}) {
      Problem problem = fake_problem(hidden);
      auto space = family.space(problem, device);
      for (std::size_t budget : {1, 2, 5, 8, 12, 1000}) {
        for (std::int64_t rows : {0, 1, 100, 5000}) {
          CAPTURE(with_extra);
          CAPTURE(hidden);
          CAPTURE(budget);
          CAPTURE(rows);
          auto chosen = candidates(family, problem, device, TuneMode::fast, budget, rows);
          REQUIRE(!chosen.empty());
          CHECK(chosen.size() <= budget);
          CHECK(chosen.front() == family.heuristic_config);
          check_unique_subset(chosen, space);
          CHECK(chosen == candidates(family, problem, device, TuneMode::fast, budget, rows));
          CHECK(chosen ==
                candidates(FakeFamily(family), problem, device, TuneMode::fast, budget, rows));
        }
      }
    }
  }
}

TEST_CASE("candidates: a fast budget of 0 still measures the heuristic") {
  FakeFamily family;
  auto chosen = candidates(family, fake_problem(1024), DeviceTraits{}, TuneMode::fast, 0);
  REQUIRE(chosen.size() == 1);
  CHECK(chosen[0] == family.heuristic_config);
}

TEST_CASE("candidates: fast mode spends its budget around the heuristic") {
  FakeFamily family;
  auto chosen = candidates(family, fake_problem(1024), DeviceTraits{}, TuneMode::fast, 8);
  REQUIRE(chosen.size() == 8);
  // Threads per row and CTA size doubled and halved, at the heuristic's vector width.
  for (Config neighbour : {Config{16, 64, 128, {}}, Config{16, 16, 128, {}},
                           Config{16, 32, 256, {}}, Config{16, 32, 64, {}}}) {
    CAPTURE(neighbour.key());
    CHECK(contains(std::vector<Config>(chosen.begin(), chosen.begin() + 5), neighbour));
  }
  // Every other vector width is represented.
  std::set<int> widths;
  for (const Config& config : chosen) widths.insert(config.vec_bytes);
  CHECK(widths == std::set<int>{4, 8, 16});
}

TEST_CASE("candidates: fast mode drops configs holding more than 64 floats per thread") {
  FakeFamily family;
  family.heuristic_config = Config{16, 128, 256, {}};
  Problem problem = fake_problem(4096);
  auto space = family.space(problem, DeviceTraits{});
  auto friendly = register_friendly(space, problem.hidden);
  REQUIRE(friendly.size() < space.size());  // the rule has something to drop

  auto chosen = candidates(family, problem, DeviceTraits{}, TuneMode::fast, 1000);
  for (const Config& config : chosen) {
    CAPTURE(config.key());
    CHECK(contains(friendly, config));
  }
  CHECK(chosen.size() == friendly.size());  // nothing else was dropped
}

TEST_CASE("candidates: a spilling heuristic is still measured first") {
  FakeFamily family;  // v16.t32.c128 holds 128 floats per thread at hidden 4096
  Problem problem = fake_problem(4096);
  auto chosen = candidates(family, problem, DeviceTraits{}, TuneMode::fast, 1000);
  REQUIRE(!chosen.empty());
  CHECK(chosen.front() == family.heuristic_config);
  for (std::size_t i = 1; i < chosen.size(); ++i) CHECK(chosen[i].threads_per_row >= 64);
}

TEST_CASE("candidates: when every config spills, those that spill least are measured") {
  FakeFamily family;  // at most 128 threads per row: 512 floats each at hidden 65536
  Problem problem = fake_problem(65536);
  auto chosen = candidates(family, problem, DeviceTraits{}, TuneMode::fast, 1000);
  REQUIRE(chosen.size() > 1);
  CHECK(chosen.front() == family.heuristic_config);
  for (std::size_t i = 1; i < chosen.size(); ++i) CHECK(chosen[i].threads_per_row == 128);
}

TEST_CASE("candidates: fast mode drops configs that leave most SMs idle for the bucket's rows") {
  FakeFamily family;
  DeviceTraits device;
  device.sm_count = 132;
  Problem problem = fake_problem(1024);
  auto friendly = register_friendly(family.space(problem, device), problem.hidden);

  // 100 rows tune as 128: one row per CTA gives 128 CTAs on 132 SMs; two rows per CTA give
  // 64, half the fill, which is dropped.
  auto chosen = candidates(family, problem, device, TuneMode::fast, 1000, 100);
  std::vector<Config> one_row_per_cta;
  for (const Config& config : friendly) {
    if (config.rows_per_cta() == 1) one_row_per_cta.push_back(config);
  }
  REQUIRE(!one_row_per_cta.empty());
  REQUIRE(one_row_per_cta.size() < friendly.size());
  CHECK(chosen.front() == family.heuristic_config);  // 4 rows per CTA, kept as the reference
  std::vector<Config> rest(chosen.begin() + 1, chosen.end());
  std::sort(rest.begin(), rest.end(), [](auto& a, auto& b) { return a.key() < b.key(); });
  std::sort(one_row_per_cta.begin(), one_row_per_cta.end(),
            [](auto& a, auto& b) { return a.key() < b.key(); });
  CHECK(rest == one_row_per_cta);
}

TEST_CASE("candidates: SM fill prunes nothing when every config fills the SMs alike") {
  FakeFamily family;
  Problem problem = fake_problem(1024);
  auto friendly = register_friendly(family.space(problem, DeviceTraits{}), problem.hidden);
  // One row: one CTA whatever the config. Many rows: every config runs many full waves.
  // Unknown rows (0): no wave pruning at all.
  for (std::int64_t rows : {0, 1, 65536}) {
    CAPTURE(rows);
    auto chosen = candidates(family, problem, DeviceTraits{}, TuneMode::fast, 1000, rows);
    CHECK(chosen.size() == friendly.size());
  }
}

TEST_CASE("candidates: a heuristic outside the family's space is an error") {
  FakeFamily family;
  family.heuristic_config = Config{16, 256, 128, {}};  // more threads per row than per CTA
  Problem problem = fake_problem(1024);
  CHECK_THROWS_AS(candidates(family, problem, DeviceTraits{}, TuneMode::fast), Error);
  CHECK_THROWS_AS(candidates(family, problem, DeviceTraits{}, TuneMode::full), Error);
  CHECK(candidates(family, problem, DeviceTraits{}, TuneMode::off).size() == 1);
}

}  // namespace kiln
