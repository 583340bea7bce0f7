#include <doctest/doctest.h>

#include "fakes.h"
#include "tuner/pruning.h"
#include "tuner/tuner.h"

namespace kiln {

using testing::fake_problem;
using testing::FakeFamily;

TEST_CASE("floats_per_thread: a thread's share of the row, in whole vectors") {
  // fp32, 16-byte vectors: 4 elements each.
  CHECK(floats_per_thread(fake_problem(4096), Config{16, 64, 256, {}}) == 64);
  CHECK(floats_per_thread(fake_problem(4096), Config{16, 32, 256, {}}) == 128);
  // 1000 elements over 32 threads x 4: 8 steps of 4 (the last one partly empty).
  CHECK(floats_per_thread(fake_problem(1000), Config{16, 32, 256, {}}) == 32);
  CHECK(floats_per_thread(fake_problem(1000), Config{4, 32, 256, {}}) == 32);
  CHECK(floats_per_thread(fake_problem(1000), Config{16, 8, 256, {}}) == 128);
  // bf16, 16-byte vectors: 8 elements each.
  CHECK(floats_per_thread(fake_problem(4096, DType::bf16), Config{16, 64, 256, {}}) == 64);
  CHECK(floats_per_thread(fake_problem(100, DType::bf16), Config{16, 32, 256, {}}) == 8);
}

TEST_CASE("sm_fill: busy SM share over the kernel's waves") {
  FakeFamily family;
  DeviceTraits device;
  device.sm_count = 132;
  Problem problem = fake_problem(1024);
  const Config one_row{16, 128, 128, {}};   // 1 row per CTA
  const Config four_rows{16, 32, 128, {}};  // 4 rows per CTA
  CHECK(sm_fill(family, problem, one_row, device, 100) == doctest::Approx(100.0 / 132));
  CHECK(sm_fill(family, problem, four_rows, device, 100) == doctest::Approx(25.0 / 132));
  CHECK(sm_fill(family, problem, one_row, device, 132) == doctest::Approx(1.0));
  // One CTA over a whole wave: the second wave is nearly empty.
  CHECK(sm_fill(family, problem, one_row, device, 133) == doctest::Approx(133.0 / 264));
  CHECK(sm_fill(family, problem, one_row, device, 264) == doctest::Approx(1.0));
  CHECK(sm_fill(family, problem, one_row, device, 1) == doctest::Approx(1.0 / 132));
}

TEST_CASE("prune_static keeps the pool's order and the kept config") {
  FakeFamily family;
  DeviceTraits device;
  Problem problem = fake_problem(4096);
  std::vector<Config> pool = {
      {16, 128, 128, {}}, {16, 32, 128, {}}, {16, 64, 64, {}}, {8, 16, 64, {}}, {8, 128, 256, {}}};
  // v16.t32 and v8.t16 hold 128 and 256 floats; only the kept one of them survives.
  auto kept = prune_static(family, problem, device, 0, pool, Config{16, 32, 128, {}});
  CHECK(kept == std::vector<Config>{
                    {16, 128, 128, {}}, {16, 32, 128, {}}, {16, 64, 64, {}}, {8, 128, 256, {}}});
  // 100 rows on 132 SMs: one row per CTA (100 CTAs) beats two (50) and four (25).
  kept = prune_static(family, problem, device, 100, pool, Config{16, 32, 128, {}});
  CHECK(kept == std::vector<Config>{{16, 128, 128, {}}, {16, 32, 128, {}}, {16, 64, 64, {}}});
  CHECK(prune_static(family, problem, device, 100, {}, Config{}).empty());
}

TEST_CASE("prune_static drops what the family calls not worth measuring at the row bucket") {
  FakeFamily family;
  std::vector<std::int64_t> asked;
  // Splits of 64 or fewer threads a row pay only at one row, in this family.
  family.worth = [&](const Config& config, std::int64_t rows) {
    asked.push_back(rows);
    return config.threads_per_row > 64 || rows <= 1;
  };
  DeviceTraits device;
  const Problem problem = fake_problem(4096);
  const std::vector<Config> pool = {{16, 128, 128, {}}, {16, 64, 64, {}}, {16, 32, 128, {}}};
  const Config keep{16, 32, 128, {}};
  // The kept config stays, whatever the family says.
  CHECK(prune_static(family, problem, device, 100, pool, keep) ==
        std::vector<Config>{{16, 128, 128, {}}, {16, 32, 128, {}}});
  REQUIRE(!asked.empty());
  for (std::int64_t rows : asked) {
    CHECK(rows == row_bucket(family, problem, 100));
  }
  CHECK(prune_static(family, problem, device, 1, pool, keep) == pool);
  // Without a row count the family is not asked.
  asked.clear();
  CHECK(prune_static(family, problem, device, 0, pool, keep).size() == 3);
  CHECK(asked.empty());
}

}  // namespace kiln
