#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "tuner/search_order.h"

namespace kiln {
namespace {

// v{4,8,16} x t{16,32,64} x c{64,128,256}, threads per row never above the CTA's.
std::vector<Config> grid_pool() {
  std::vector<Config> pool;
  for (int vec : {4, 8, 16}) {
    for (int tpr : {16, 32, 64}) {
      for (int cta : {64, 128, 256}) {
        if (tpr <= cta) pool.push_back(Config{vec, tpr, cta, {}});
      }
    }
  }
  return pool;
}

std::vector<std::string> keys(const std::vector<Config>& configs) {
  std::vector<std::string> keys;
  keys.reserve(configs.size());
  for (const Config& config : configs) keys.push_back(config.key());
  return keys;
}

std::vector<std::string> sorted_keys(const std::vector<Config>& configs) {
  auto sorted = keys(configs);
  std::sort(sorted.begin(), sorted.end());
  return sorted;
}

Config with_extra(Config config, std::int64_t persistent) {
  config.extra["persistent"] = persistent;
  return config;
}

// grid_pool() with a persistent extra of 0 and of 1 on every config.
std::vector<Config> persistent_pool() {
  std::vector<Config> pool;
  for (const Config& config : grid_pool()) {
    pool.push_back(with_extra(config, 0));
    pool.push_back(with_extra(config, 1));
  }
  return pool;
}

}  // namespace

TEST_CASE("order_around: a permutation of the pool") {
  auto pool = grid_pool();
  for (const Config& centre : pool) {
    CAPTURE(centre.key());
    CHECK(sorted_keys(order_around(centre, pool)) == sorted_keys(pool));
  }
  CHECK(order_around(Config{16, 32, 128, {}}, {}).empty());
}

TEST_CASE("order_around: centre, its neighbours, each other width's nearest, their neighbours") {
  auto order = order_around(Config{8, 32, 128, {}}, grid_pool());
  REQUIRE(order.size() >= 11);
  std::vector<Config> head(order.begin(), order.begin() + 11);
  std::vector<Config> expected = {
      {8, 32, 128, {}},                                                          // centre
      {8, 64, 128, {}},  {8, 16, 128, {}},  {8, 32, 256, {}},  {8, 32, 64, {}},  // neighbours
      {16, 32, 128, {}}, {4, 32, 128, {}},                                       // widest first
      {16, 64, 128, {}}, {16, 16, 128, {}}, {16, 32, 256, {}}, {16, 32, 64, {}}  // widest's
  };
  CHECK(keys(head) == keys(expected));
}

TEST_CASE("order_around: neighbours missing from the pool are skipped") {
  // At the corner of the grid: no t128, no c512.
  auto order = order_around(Config{16, 64, 256, {}}, grid_pool());
  REQUIRE(order.size() >= 3);
  CHECK(order[0] == Config{16, 64, 256, {}});
  CHECK(order[1] == Config{16, 32, 256, {}});
  CHECK(order[2] == Config{16, 64, 128, {}});
}

TEST_CASE("order_around: another width is represented by its config nearest the centre") {
  std::vector<Config> pool = {{16, 16, 512, {}}, {16, 64, 128, {}}, {8, 32, 128, {}}};
  auto order = order_around(Config{8, 32, 128, {}}, pool);
  // t64.c128 is one doubling from t32.c128; t16.c512 is three.
  CHECK(keys(order) ==
        keys({Config{8, 32, 128, {}}, Config{16, 64, 128, {}}, Config{16, 16, 512, {}}}));
}

TEST_CASE("order_around: extras of the centre's shape come before the other widths") {
  std::vector<Config> pool = persistent_pool();
  Config centre = with_extra(Config{8, 32, 128, {}}, 0);
  auto order = order_around(centre, pool);
  REQUIRE(order.size() == pool.size());
  CHECK(order[0] == centre);
  for (int i = 1; i <= 4; ++i) CHECK(order[i].extra.at("persistent") == 0);
  CHECK(order[5] == with_extra(Config{8, 32, 128, {}}, 1));
  CHECK(order[6] == with_extra(Config{16, 32, 128, {}}, 0));
  CHECK(order[7] == with_extra(Config{4, 32, 128, {}}, 0));
}

TEST_CASE("order_around: splits between the neighbours come before the other widths") {
  std::vector<Config> pool = grid_pool();
  pool.push_back(Config{8, 48, 128, {}});  // whole warps between t32 and t64
  pool.push_back(Config{8, 96, 128, {}});  // past t64: not between the neighbours
  auto order = order_around(Config{8, 32, 128, {}}, pool);
  REQUIRE(order.size() == pool.size());
  CHECK(order[5] == Config{8, 48, 128, {}});
  CHECK(order[6] == Config{16, 32, 128, {}});
  CHECK(std::find(order.begin(), order.begin() + 7, Config{8, 96, 128, {}}) == order.begin() + 7);
}

TEST_CASE("order_around: the same pool gives the same order") {
  auto pool = grid_pool();
  CHECK(keys(order_around(pool[5], pool)) == keys(order_around(pool[5], grid_pool())));
}

TEST_CASE(
    "refine_around: the winner's extras, its row split at the next narrower width, its split "
    "neighbours with every extra, then the rest") {
  std::vector<Config> pool = persistent_pool();
  const Config best = with_extra(Config{16, 32, 128, {}}, 0);
  const std::vector<Config> measured = {best, with_extra(Config{16, 64, 128, {}}, 0),
                                        with_extra(Config{8, 32, 128, {}}, 0)};
  const auto order = refine_around(best, pool, measured);
  REQUIRE(order.size() == pool.size() - measured.size());
  for (const Config& config : measured) {
    CHECK(std::find(order.begin(), order.end(), config) == order.end());
  }
  CHECK(order[0] == with_extra(Config{16, 32, 128, {}}, 1));
  // Half the width with twice the threads per row: the same elements per pass.
  CHECK(order[1] == with_extra(Config{8, 64, 128, {}}, 0));
  CHECK(order[2] == with_extra(Config{8, 64, 128, {}}, 1));
  // The split doubled (its extra-0 form was measured in the first round), then halved.
  CHECK(order[3] == with_extra(Config{16, 64, 128, {}}, 1));
  CHECK(order[4] == with_extra(Config{16, 16, 128, {}}, 0));
  CHECK(order[5] == with_extra(Config{16, 16, 128, {}}, 1));
  // The narrower split in CTAs of as many rows as the winner's, then the winner's own shape.
  CHECK(order[6] == with_extra(Config{8, 64, 256, {}}, 0));
  CHECK(order[7] == with_extra(Config{8, 64, 256, {}}, 1));
  CHECK(order[8] == with_extra(Config{8, 32, 128, {}}, 1));  // its extra-0 twin was measured
  // The narrowest width comes only with the rest, not as a step of its own.
  CHECK(order[9].vec_bytes != 4);
  CHECK(sorted_keys(order) == sorted_keys([&] {
          std::vector<Config> rest;
          for (const Config& c : pool)
            if (std::find(measured.begin(), measured.end(), c) == measured.end()) rest.push_back(c);
          return rest;
        }()));
  CHECK(keys(refine_around(best, pool, measured)) == keys(order));
}

TEST_CASE(
    "refine_around: after the winner's extras, its shape in narrower vectors (plain, then with "
    "its extras), then the two nearest splits that are not powers of two, with every extra") {
  std::vector<Config> pool = persistent_pool();
  for (int persistent : {0, 1}) {
    pool.push_back(with_extra(Config{16, 96, 384, {}}, persistent));  // third nearest
    pool.push_back(with_extra(Config{16, 48, 192, {}}, persistent));
    pool.push_back(with_extra(Config{16, 24, 96, {}}, persistent));
  }
  pool.push_back(with_extra(Config{16, 48, 48, {}}, 0));    // one row a CTA, not four
  pool.push_back(with_extra(Config{8, 48, 192, {}}, 0));    // another width
  pool.push_back(with_extra(Config{16, 160, 640, {}}, 0));  // five times the split
  pool.push_back(Config{8, 32, 128, {}});                   // no extras at all
  const Config best = with_extra(Config{16, 32, 128, {}}, 0);
  const auto order = refine_around(best, pool, {best});
  REQUIRE(order.size() == pool.size() - 1);
  CHECK(order[0] == with_extra(Config{16, 32, 128, {}}, 1));
  CHECK(order[1] == (Config{8, 32, 128, {}}));
  CHECK(order[2] == with_extra(Config{8, 32, 128, {}}, 0));
  CHECK(order[3] == with_extra(Config{16, 24, 96, {}}, 0));
  CHECK(order[4] == with_extra(Config{16, 24, 96, {}}, 1));
  CHECK(order[5] == with_extra(Config{16, 48, 192, {}}, 0));
  CHECK(order[6] == with_extra(Config{16, 48, 192, {}}, 1));
  // Then the narrower width's same split, as before.
  CHECK(order[7] == with_extra(Config{8, 64, 128, {}}, 0));
  const auto position = [&](const Config& config) {
    return std::find(order.begin(), order.end(), config) - order.begin();
  };
  CHECK(position(with_extra(Config{16, 96, 384, {}}, 0)) > 7);
  CHECK(position(with_extra(Config{16, 48, 48, {}}, 0)) > 7);
  CHECK(position(with_extra(Config{8, 48, 192, {}}, 0)) > 7);
  CHECK(position(with_extra(Config{16, 160, 640, {}}, 0)) > 7);
}

TEST_CASE(
    "refine_around: after the split steps, the winner's diagonal neighbours in each row form "
    "the family names, which otherwise wait for the rest") {
  std::vector<Config> pool;
  for (const Config& config : grid_pool()) {
    pool.push_back(config);
    pool.push_back(
        Config{config.vec_bytes, config.threads_per_row, config.cta_threads, {{"reread", 1}}});
  }
  const auto reread = [](int vec, int tpr, int cta) {
    return Config{vec, tpr, cta, {{"reread", 1}}};
  };
  const Config best{16, 32, 128, {}};
  const std::string_view forms[] = {"reread"};
  const auto order = refine_around(best, pool, {best}, forms);
  REQUIRE(order.size() == pool.size() - 1);
  CHECK(order[0] == reread(16, 32, 128));
  CHECK(order[1] == (Config{8, 32, 128, {}}));
  CHECK(order[2] == (Config{8, 64, 128, {}}));
  CHECK(order[3] == reread(8, 64, 128));
  CHECK(order[4] == (Config{16, 64, 128, {}}));
  CHECK(order[5] == reread(16, 64, 128));
  CHECK(order[6] == (Config{16, 16, 128, {}}));
  CHECK(order[7] == reread(16, 16, 128));
  // Threads per row and CTA threads doubled together, then halved: as many rows a CTA.
  CHECK(order[8] == reread(16, 64, 256));
  CHECK(order[9] == reread(16, 16, 64));
  // Not the plain diagonal: the held row's best split is what the rounds already searched.
  CHECK(order[10] != (Config{16, 64, 256, {}}));
  CHECK(order[10] != (Config{16, 16, 64, {}}));

  const auto without = refine_around(best, pool, {best});
  const auto position = [&](const Config& config) {
    return std::find(without.begin(), without.end(), config) - without.begin();
  };
  CHECK(position(reread(16, 64, 256)) > 9);
  CHECK(position(reread(16, 16, 64)) > 9);
}

TEST_CASE(
    "refine_around: an extra the winner's shape never carries is tried at its diagonal "
    "neighbours, one carried there is not") {
  // Every config plain; the grid extra only where a CTA holds at most 128 threads, as a
  // register-bound space allows it.
  std::vector<Config> pool;
  for (const Config& config : grid_pool()) {
    pool.push_back(config);
    if (config.cta_threads <= 128) {
      for (int grid : {132, 264}) {
        pool.push_back(
            Config{config.vec_bytes, config.threads_per_row, config.cta_threads, {{"grid", grid}}});
      }
    }
  }
  const auto grid = [](int tpr, int cta, int value) {
    return Config{16, tpr, cta, {{"grid", value}}};
  };
  const auto position_in = [](const std::vector<Config>& order, const Config& config) {
    return std::find(order.begin(), order.end(), config) - order.begin();
  };
  // 256-thread CTAs carry no grid: the halved diagonal's grids come right after the split steps.
  const Config wide{16, 64, 256, {}};
  const auto order = refine_around(wide, pool, {wide});
  const auto diagonal_grids = position_in(order, grid(32, 128, 132));
  CHECK(diagonal_grids < 8);
  CHECK(position_in(order, grid(32, 128, 264)) == diagonal_grids + 1);
  // Not the plain diagonal, which is no form the winner's shape lacks.
  CHECK(position_in(order, Config{16, 32, 128, {}}) > diagonal_grids + 1);

  // A winner whose shape carries grids: its diagonals' grids wait for the rest.
  const Config narrow{16, 32, 128, {}};
  const auto held = refine_around(narrow, pool, {narrow});
  CHECK(position_in(held, grid(16, 64, 132)) > 11);
  CHECK(position_in(held, grid(16, 64, 264)) > 11);
}

}  // namespace kiln
