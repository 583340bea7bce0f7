#include "tuner/search_order.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>

namespace kiln {
namespace {

// The second round's uneven splits (see refine_around). Replayed on the 200 recorded H200
// full tunes of tests/cpp/tuner/data, 2 leave the fast choice 0.57% behind the best on average
// at the buckets' rows and 0.59% at 2688 rows (none: 0.67% and 0.96%; 1: 0.59% and 0.80%; 3
// as 2).
constexpr std::size_t kUnevenSplits = 2;

double doublings(int a, int b) {
  return std::abs(std::log2(static_cast<double>(std::max(a, 1))) -
                  std::log2(static_cast<double>(std::max(b, 1))));
}

int extras_differing(const Config& a, const Config& b) {
  std::set<std::string> names;
  for (const auto& [name, value] : a.extra) {
    names.insert(name);
  }
  for (const auto& [name, value] : b.extra) {
    names.insert(name);
  }
  int count = 0;
  for (const std::string& name : names) {
    auto in_a = a.extra.find(name);
    auto in_b = b.extra.find(name);
    bool same = in_a != a.extra.end() && in_b != b.extra.end() && in_a->second == in_b->second;
    count += same ? 0 : 1;
  }
  return count;
}

// The same width, threads per row and CTA threads: configs that differ at most in extras.
bool same_shape(const Config& a, const Config& b) {
  return a.vec_bytes == b.vec_bytes && a.threads_per_row == b.threads_per_row &&
         a.cta_threads == b.cta_threads;
}

// Distance in everything but vector width.
double shape_distance(const Config& a, const Config& b) {
  return doublings(a.threads_per_row, b.threads_per_row) + doublings(a.cta_threads, b.cta_threads) +
         extras_differing(a, b);
}

double distance(const Config& a, const Config& b) {
  return shape_distance(a, b) + doublings(a.vec_bytes, b.vec_bytes);
}

// The configs one doubling or halving of threads_per_row or cta_threads away.
std::vector<Config> steps_from(const Config& from) {
  std::vector<Config> steps;
  auto add = [&](int Config::*field, bool up) {
    Config step = from;
    int& value = step.*field;
    if (up) {
      value *= 2;
    } else if (value % 2 == 0) {
      value /= 2;
    } else {
      return;
    }
    steps.push_back(step);
  };
  add(&Config::threads_per_row, true);
  add(&Config::threads_per_row, false);
  add(&Config::cta_threads, true);
  add(&Config::cta_threads, false);
  return steps;
}

// The configs with threads per row and CTA threads both doubled, then both halved (where
// even), with `from`'s width and extras.
std::vector<Config> diagonal_steps(const Config& from) {
  std::vector<Config> steps;
  Config up = from;
  up.threads_per_row *= 2;
  up.cta_threads *= 2;
  steps.push_back(up);
  if (from.threads_per_row % 2 == 0 && from.cta_threads % 2 == 0) {
    Config down = from;
    down.threads_per_row /= 2;
    down.cta_threads /= 2;
    steps.push_back(down);
  }
  return steps;
}

class Ordering {
 public:
  explicit Ordering(const std::vector<Config>& pool) : pool_(pool), taken_(pool.size()) {}

  std::optional<std::size_t> find(const Config& config) const {
    auto it = std::find(pool_.begin(), pool_.end(), config);
    if (it == pool_.end()) {
      return std::nullopt;
    }
    return static_cast<std::size_t>(it - pool_.begin());
  }
  void take(std::size_t index) {
    if (taken_[index]) {
      return;
    }
    taken_[index] = true;
    order_.push_back(pool_[index]);
  }
  void take(const Config& config) {
    if (auto index = find(config)) {
      take(*index);
    }
  }
  // The untaken indices that `wanted` accepts, sorted by `key` (stable: pool order breaks ties).
  std::vector<std::size_t> untaken(const std::function<bool(const Config&)>& wanted,
                                   const std::function<double(const Config&)>& key) const {
    std::vector<std::size_t> indices;
    for (std::size_t i = 0; i < pool_.size(); ++i) {
      if (!taken_[i] && wanted(pool_[i])) {
        indices.push_back(i);
      }
    }
    std::stable_sort(indices.begin(), indices.end(),
                     [&](std::size_t a, std::size_t b) { return key(pool_[a]) < key(pool_[b]); });
    return indices;
  }
  const Config& at(std::size_t index) const { return pool_[index]; }
  std::size_t size() const { return order_.size(); }
  std::vector<Config> release() { return std::move(order_); }

 private:
  const std::vector<Config>& pool_;
  std::vector<bool> taken_;
  std::vector<Config> order_;
};

}  // namespace

std::vector<Config> order_around(const Config& centre, const std::vector<Config>& pool) {
  Ordering ordering(pool);
  ordering.take(centre);
  for (const Config& step : steps_from(centre)) {
    ordering.take(step);
  }

  auto centre_shape = [&](const Config& c) { return same_shape(c, centre); };
  auto extras_distance = [&](const Config& c) {
    return static_cast<double>(extras_differing(c, centre));
  };
  for (std::size_t index : ordering.untaken(centre_shape, extras_distance)) {
    ordering.take(index);
  }

  // Splits between the centre's neighbours (a family may offer threads-per-row counts that
  // are not powers of two, e.g. whole warps that divide a row exactly).
  auto between = [&](const Config& c) {
    return c.vec_bytes == centre.vec_bytes && c.extra == centre.extra &&
           c.threads_per_row != centre.threads_per_row &&
           2 * c.threads_per_row > centre.threads_per_row &&
           c.threads_per_row < 2 * centre.threads_per_row;
  };
  auto from_centre_shape = [&](const Config& c) { return shape_distance(c, centre); };
  for (std::size_t index : ordering.untaken(between, from_centre_shape)) {
    ordering.take(index);
  }

  std::set<int, std::greater<>> other_widths;
  for (const Config& config : pool) {
    if (config.vec_bytes != centre.vec_bytes) {
      other_widths.insert(config.vec_bytes);
    }
  }
  std::vector<Config> width_leaders;
  for (int width : other_widths) {
    auto nearest = ordering.untaken([&](const Config& c) { return c.vec_bytes == width; },
                                    [&](const Config& c) { return shape_distance(c, centre); });
    if (nearest.empty()) {
      continue;
    }
    width_leaders.push_back(ordering.at(nearest.front()));
    ordering.take(nearest.front());
  }
  for (const Config& leader : width_leaders) {
    for (const Config& step : steps_from(leader)) {
      ordering.take(step);
    }
  }

  auto anything = [](const Config&) { return true; };
  auto from_centre = [&](const Config& c) { return distance(c, centre); };
  for (std::size_t index : ordering.untaken(anything, from_centre)) {
    ordering.take(index);
  }
  return ordering.release();
}

std::vector<Config> refine_around(const Config& best, const std::vector<Config>& pool,
                                  const std::vector<Config>& measured,
                                  std::span<const std::string_view> row_forms) {
  Ordering ordering(pool);
  for (const Config& config : measured) {
    if (auto index = ordering.find(config)) {
      ordering.take(*index);
    }
  }
  const std::size_t already = ordering.size();

  auto extras_distance = [&](const Config& c) {
    return static_cast<double>(extras_differing(c, best));
  };
  // Every config of one (width, threads per row, CTA threads), fewest extras changed first.
  auto take_shape = [&](int vec_bytes, int threads_per_row, int cta_threads) {
    const Config of_shape{vec_bytes, threads_per_row, cta_threads, {}};
    const auto shape = [&](const Config& c) { return same_shape(c, of_shape); };
    for (std::size_t index : ordering.untaken(shape, extras_distance)) {
      ordering.take(index);
    }
  };
  take_shape(best.vec_bytes, best.threads_per_row, best.cta_threads);

  int narrower = 0;
  for (const Config& config : pool) {
    if (config.vec_bytes < best.vec_bytes) {
      narrower = std::max(narrower, config.vec_bytes);
    }
  }
  const int ratio = narrower > 0 ? best.vec_bytes / narrower : 1;
  // `best`'s own shape in narrower vectors, without extras and with `best`'s: two configs,
  // where its other extras and the uneven splits below would otherwise fill the round before
  // it (adaln 3584 wide, whose best is 8-byte vectors: 1.029-1.045 of the best without them).
  if (narrower > 0) {
    Config plain{narrower, best.threads_per_row, best.cta_threads, {}};
    ordering.take(plain);
    plain.extra = best.extra;
    ordering.take(plain);
  }

  // Splits that are not powers of two (whole warps that divide the row exactly, where the
  // family offers them), above half and below four times `best`'s, in CTAs of as many rows.
  // At 2688 rows they win with a persistent grid, a combination the first round, centred on
  // power-of-two splits, does not reach (rms_norm 1536 wide: 96 threads a row, not 32).
  const auto is_power_of_two = [](int value) { return value > 0 && (value & (value - 1)) == 0; };
  const int rows_per_cta = best.cta_threads / std::max(best.threads_per_row, 1);
  const auto uneven_split = [&](const Config& c) {
    return c.vec_bytes == best.vec_bytes && !is_power_of_two(c.threads_per_row) &&
           2 * c.threads_per_row > best.threads_per_row &&
           c.threads_per_row < 4 * best.threads_per_row &&
           c.cta_threads == c.threads_per_row * rows_per_cta;
  };
  const auto split_distance = [&](const Config& c) {
    return doublings(c.threads_per_row, best.threads_per_row);
  };
  std::vector<int> uneven_splits;
  for (std::size_t index : ordering.untaken(uneven_split, split_distance)) {
    const int split = ordering.at(index).threads_per_row;
    if (std::find(uneven_splits.begin(), uneven_splits.end(), split) == uneven_splits.end()) {
      uneven_splits.push_back(split);
    }
  }
  if (uneven_splits.size() > kUnevenSplits) {
    uneven_splits.resize(kUnevenSplits);
  }
  for (const int split : uneven_splits) {
    take_shape(best.vec_bytes, split, split * rows_per_cta);
  }

  if (narrower > 0) {
    take_shape(narrower, best.threads_per_row * ratio, best.cta_threads);
  }
  // The first round compared the start's neighbours at the start's extras only; a neighbour
  // can win with another extra (LayerNorm 14848 wide: half the split, staged).
  for (const Config& step : steps_from(best)) {
    if (step.cta_threads == best.cta_threads) {
      take_shape(step.vec_bytes, step.threads_per_row, step.cta_threads);
    }
  }
  // A row re-read or staged instead of held changes what a thread keeps, so its best split is
  // seldom the held row's: adaln 2688x8192 holds best in 256 threads a row and re-reads best in
  // 128, one row a CTA either way, a shape neither round reached (1.035 the best's time).
  for (const Config& diagonal : diagonal_steps(best)) {
    for (std::string_view form : row_forms) {
      Config flagged = diagonal;
      flagged.extra = {{std::string(form), 1}};
      ordering.take(flagged);
    }
  }
  // An extra that no config of `best`'s shape carries was never in the race: the space rules it
  // out there (a persistent grid's prefetch takes registers a wide row's split lacks), so take
  // it where the diagonals allow it (adaln 2688x14848: held in 512 threads a row, best in 256
  // with a persistent grid, 1.018 the best's time without).
  std::set<std::string> absent;
  for (const Config& config : pool) {
    for (const auto& [name, value] : config.extra) {
      absent.insert(name);
    }
  }
  for (const Config& config : pool) {
    if (same_shape(config, best)) {
      for (const auto& [name, value] : config.extra) {
        absent.erase(name);
      }
    }
  }
  for (const Config& diagonal : diagonal_steps(best)) {
    const auto carries_absent = [&](const Config& c) {
      return same_shape(c, diagonal) && c.extra.size() == 1 &&
             absent.count(c.extra.begin()->first) != 0;
    };
    for (std::size_t index : ordering.untaken(carries_absent, extras_distance)) {
      ordering.take(index);
    }
  }
  if (narrower > 0) {
    take_shape(narrower, best.threads_per_row * ratio, best.cta_threads * ratio);
    take_shape(narrower, best.threads_per_row, best.cta_threads);
  }
  for (const Config& config : order_around(best, pool)) {
    ordering.take(config);
  }
  std::vector<Config> order = ordering.release();
  order.erase(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(already));
  return order;
}

}  // namespace kiln
