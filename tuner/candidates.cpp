// Which configs a tune measures, per mode.
#include <algorithm>
#include <string>

#include "cache/error.h"
#include "tuner/pruning.h"
#include "tuner/search_order.h"
#include "tuner/tuner.h"

namespace kiln {
namespace {

// A family's space should hold no duplicates; measuring one twice would only waste time.
std::vector<Config> distinct_in_order(const std::vector<Config>& configs) {
  std::vector<Config> distinct;
  for (const Config& config : configs) {
    if (std::find(distinct.begin(), distinct.end(), config) == distinct.end()) {
      distinct.push_back(config);
    }
  }
  return distinct;
}

// The reference config, checked to be one of the family's own: every tuned candidate is
// checked against its output, a tune that fails falls back to it, and a fast search starts
// from it.
Config checked_reference(const Family& family, const Problem& problem, const DeviceTraits& device,
                         std::int64_t rows, const std::vector<Config>& space) {
  Config reference = reference_config(family, problem, device, rows);
  if (std::find(space.begin(), space.end(), reference) == space.end()) {
    throw Error("kiln." + std::string(family.name()) + " tuner: the heuristic config " +
                reference.key() + " for " + problem.key() + " is not in the family's space (of " +
                std::to_string(space.size()) + " configs)");
  }
  return reference;
}

}  // namespace

Config reference_config(const Family& family, const Problem& problem, const DeviceTraits& device,
                        std::int64_t rows) {
  return rows > 0 ? family.heuristic_for_rows(problem, device, row_bucket(family, problem, rows))
                  : family.heuristic(problem, device);
}

std::vector<Config> candidates(const Family& family, const Problem& problem,
                               const DeviceTraits& device, TuneMode mode, std::size_t fast_budget,
                               std::int64_t rows) {
  if (mode == TuneMode::off) {
    return {reference_config(family, problem, device, rows)};
  }
  std::vector<Config> space = distinct_in_order(family.space(problem, device));
  const Config start = checked_reference(family, problem, device, rows, space);
  if (mode == TuneMode::full) {
    return space;
  }

  std::vector<Config> pool = prune_static(family, problem, device, rows, space, start);
  std::vector<Config> ordered = order_around(start, pool);
  // The start is always measured, so a budget of 0 still means one candidate.
  ordered.resize(std::min(ordered.size(), std::max<std::size_t>(fast_budget, 1)));
  return ordered;
}

std::vector<Config> refinement_candidates(const Family& family, const Problem& problem,
                                          const DeviceTraits& device, std::int64_t rows,
                                          const Config& best, const std::vector<Config>& measured,
                                          std::size_t budget) {
  const std::vector<Config> space = distinct_in_order(family.space(problem, device));
  const Config start = checked_reference(family, problem, device, rows, space);
  const std::vector<Config> pool = prune_static(family, problem, device, rows, space, start);
  std::vector<Config> ordered = refine_around(best, pool, measured, family.row_forms());
  ordered.resize(std::min(ordered.size(), budget));
  return ordered;
}

}  // namespace kiln
