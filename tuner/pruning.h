// Static pruning for the fast search: rules that need no GPU, applied before anything is
// compiled, so that the few configs the budget allows are spent on plausible ones.
#pragma once

#include <cstdint>
#include <vector>

#include "templates/family.h"

namespace kiln {

// A thread of a row-in-registers kernel keeps its share of the row live, as floats: whole
// vectors of vec_bytes, ceil(hidden / (elements per vector * threads_per_row)) of them. Beyond
// this many floats the kernel spills to local memory, which costs far more than any better
// vectorisation or thread count could win back.
inline constexpr std::int64_t kMaxFloatsPerThread = 64;

// A config whose SM fill is at most this fraction of the best fill in the space is dropped:
// with half the SMs or fewer pulling bytes, a memory-bound kernel cannot come close.
inline constexpr double kMinRelativeSmFill = 0.5;

std::int64_t floats_per_thread(const Problem& problem, const Config& config);

// How busy the SMs are over the kernel's life for `rows` rows, in (0, 1]: the family's grid
// for those rows (so a persistent grid counts as what it launches), dealt one CTA at a time
// to `device.sm_count` SMs of equal speed: ctas / (ceil(ctas / sm_count) * sm_count).
// 1 means every wave is full; a grid smaller than the SM count leaves the rest idle, and a
// grid just over a whole number of waves leaves most SMs idle in its last one. Residency of
// several CTAs per SM is ignored: for a memory-bound kernel the count of SMs pulling bytes
// is what matters first.
double sm_fill(const Family& family, const Problem& problem, const Config& config,
               const DeviceTraits& device, std::int64_t rows);

// `pool` in its own order, less:
//  - configs holding more than kMaxFloatsPerThread floats per thread (unless none holds
//    fewer, then those holding the fewest stay);
//  - when rows > 0: configs the family says are not worth measuring for
//    row_bucket(family, problem, rows) rows (Family::worth_measuring), then those whose
//    sm_fill for that many rows is at most kMinRelativeSmFill times the best fill of what
//    is left.
// `keep` (the search's starting point) is never dropped.
std::vector<Config> prune_static(const Family& family, const Problem& problem,
                                 const DeviceTraits& device, std::int64_t rows,
                                 const std::vector<Config>& pool, const Config& keep);

}  // namespace kiln
