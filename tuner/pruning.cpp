#include "tuner/pruning.h"

#include <algorithm>

#include "tuner/tuner.h"

namespace kiln {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// Keeps the configs `wanted` accepts, and `keep` wherever it is.
template <typename Predicate>
std::vector<Config> filter(const std::vector<Config>& pool, const Config& keep, Predicate wanted) {
  std::vector<Config> kept;
  for (const Config& config : pool) {
    if (config == keep || wanted(config)) {
      kept.push_back(config);
    }
  }
  return kept;
}

}  // namespace

std::int64_t floats_per_thread(const Problem& problem, const Config& config) {
  std::int64_t per_vector = std::max<std::int64_t>(
      config.vec_bytes / static_cast<std::int64_t>(dtype_size(problem.dtype)), 1);
  std::int64_t per_step = per_vector * std::max(config.threads_per_row, 1);
  return ceil_div(problem.hidden, per_step) * per_vector;
}

double sm_fill(const Family& family, const Problem& problem, const Config& config,
               const DeviceTraits& device, std::int64_t rows) {
  LaunchGeometry geometry = family.geometry(problem, config, rows);
  std::int64_t ctas = std::int64_t{geometry.grid[0]} * geometry.grid[1] * geometry.grid[2];
  ctas = std::max<std::int64_t>(ctas, 1);
  std::int64_t sms = std::max(device.sm_count, 1);
  return static_cast<double>(ctas) / static_cast<double>(ceil_div(ctas, sms) * sms);
}

std::vector<Config> prune_static(const Family& family, const Problem& problem,
                                 const DeviceTraits& device, std::int64_t rows,
                                 const std::vector<Config>& pool, const Config& keep) {
  // When every config spills, the ones that spill least are still worth measuring.
  std::int64_t fewest_floats = pool.empty() ? 0 : floats_per_thread(problem, pool.front());
  for (const Config& config : pool) {
    fewest_floats = std::min(fewest_floats, floats_per_thread(problem, config));
  }
  std::int64_t float_limit = std::max(kMaxFloatsPerThread, fewest_floats);
  std::vector<Config> kept = filter(pool, keep, [&](const Config& config) {
    return floats_per_thread(problem, config) <= float_limit;
  });
  if (rows <= 0) {
    return kept;
  }

  std::int64_t bucket = row_bucket(family, problem, rows);
  kept = filter(kept, keep, [&](const Config& config) {
    return family.worth_measuring(problem, config, device, bucket);
  });
  auto fill = [&](const Config& config) {
    return sm_fill(family, problem, config, device, bucket);
  };
  double best_fill = 0;
  for (const Config& config : kept) {
    best_fill = std::max(best_fill, fill(config));
  }
  // Exactly half the best fill (64 of 128 CTAs) compares equal bit for bit: both sides are
  // correctly rounded quotients of the same ratio, and halving is exact.
  return filter(kept, keep, [&](const Config& config) {
    return fill(config) > kMinRelativeSmFill * best_fill;
  });
}

}  // namespace kiln
