// The first autotuner: enumerate the family's valid configs, prune to a small set, ask the
// evaluator to measure them, pick the fastest with a deterministic tie rule.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "templates/family.h"
#include "tuner/evaluator.h"

namespace kiln {

enum class TuneMode : std::uint8_t { off, fast, full };
std::string_view tune_mode_name(TuneMode mode);
std::optional<TuneMode> parse_tune_mode(std::string_view text);

// Row counts share a tuning result within a bucket: the next power of two, so a new batch
// size does not retune. Buckets stop growing at `largest` rows (beyond it the kernel is in
// its steady state).
inline constexpr std::int64_t kSmallestLargestBucket = std::int64_t{1} << 16;
std::int64_t row_bucket(std::int64_t rows, std::int64_t largest = kSmallestLargestBucket);

// The largest bucket for rows of `bytes_per_row` bytes: 2^16 rows, or more where 2^16 rows
// move less than 256 MB (short rows, such as RoPE's one head per row), up to 2^22.
std::int64_t largest_row_bucket(std::int64_t bytes_per_row);

// The bucket of `rows` rows of a family's problem: row_bucket with the problem's largest
// bucket (its bytes per row from Family::bytes_moved). The same as row_bucket(rows) up to
// 2^16 rows, where a hot path can skip the family.
std::int64_t row_bucket(const Family& family, const Problem& problem, std::int64_t rows);

// The fast search's first round, around the family's heuristic: compiling and timing more
// configs per new problem would make a cold first call too slow for eager use (`full` mode
// exists for offline tuning).
inline constexpr std::size_t kFastBudget = 8;
// Its second round, around the first round's winner: the neighbours the first round could
// not reach. Replayed against 77 full tunes of the norm family on an H200 (`kiln tune
// replay`), 6 left the fast choice 0.74% behind the best on average and 8 problems over 2%;
// 10 left 0.53% and 4. The eleventh is for a row form's diagonal neighbours (refine_around):
// on the 50 full tunes at 2688 rows recorded after the evaluator's flush lowered the candidates'
// lines, 10 with them gave 1.0074 and 11 gave 1.0063, where 10 without them gave 1.0092.
inline constexpr std::size_t kRefineBudget = 11;

struct TuneResult {
  Problem problem;
  std::int64_t bucket_rows = 0;
  // The rows the candidates were timed on: the call's that missed, up to the bucket's
  // (see tune()). 0 in mode off.
  std::int64_t rows = 0;
  TuneMode mode = TuneMode::off;
  Config heuristic;
  Config winner;
  std::vector<Trial> trials;  // empty in mode off
  double tune_ms = 0;         // wall time of the whole tune
  std::string reason;         // why the winner won, in a sentence

  // `rows`, or the bucket's where a result names none (mode off).
  std::int64_t timed_rows() const { return rows > 0 ? rows : bucket_rows; }
};

void to_json(nlohmann::json& j, const TuneResult& result);
void from_json(const nlohmann::json& j, TuneResult& result);

// The heuristic for the bucket of `rows` rows (Family::heuristic_for_rows), or the row-blind
// one when `rows` is 0: what KILN_TUNE=off serves those rows, the config every tuned
// candidate is checked against, and where a fast search starts.
Config reference_config(const Family& family, const Problem& problem, const DeviceTraits& device,
                        std::int64_t rows);

// The candidates a mode measures: `off` reference_config() alone; `full` the whole space;
// `fast` at most `fast_budget` configs, first reference_config(), then configs chosen to span
// vector widths and thread counts around it. Deterministic. `rows`: the rows being tuned for;
// its row bucket picks the reference and, in fast mode, drives the pruning of configs that
// leave SMs idle (tuner/pruning.h). 0 means unknown: the row-blind heuristic, and no such
// pruning.
std::vector<Config> candidates(const Family& family, const Problem& problem,
                               const DeviceTraits& device, TuneMode mode,
                               std::size_t fast_budget = kFastBudget, std::int64_t rows = 0);

// The fast search's second round: at most `budget` configs around the first round's winner
// `best` that `measured` (the first round) does not hold, from the same statically pruned
// pool (see refine_around in tuner/search_order.h). Deterministic.
std::vector<Config> refinement_candidates(const Family& family, const Problem& problem,
                                          const DeviceTraits& device, std::int64_t rows,
                                          const Config& best, const std::vector<Config>& measured,
                                          std::size_t budget);

// The tie rule: the fastest ok trial wins, except that any ok trial within `tolerance`
// (relative) of the fastest median that comes earlier in `trials` order wins instead.
// Returns the index of the winner, or nullopt when no trial is ok.
std::optional<std::size_t> select_winner(const std::vector<Trial>& trials, double tolerance = 0.01);

// The whole tune, timing the candidates on `rows` rows; the result serves `rows`' bucket. In
// mode off, no evaluator call is made and the heuristic wins. In mode
// fast, a first round measures the candidates() around the search start and a second round the
// refinement_candidates() around the first round's winner; the tie rule then runs over both
// rounds in order, so the first round wins ties.
TuneResult tune(const Family& family, const Problem& problem, std::int64_t rows,
                const DeviceTraits& device, TuneMode mode, Evaluator& evaluator);

}  // namespace kiln
