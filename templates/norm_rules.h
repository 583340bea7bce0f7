// What the norm families share, forward and backward: the checks of a Problem, and the row
// split (a row of `hidden` elements is read as vec_bytes vectors by a group of
// threads_per_row threads, and a CTA holds cta_threads / threads_per_row such groups).
// Plain C++, no CUDA.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "cache/error.h"
#include "templates/family.h"
#include "templates/types.h"

namespace kiln {

inline constexpr std::int64_t kNormMaxHidden = 65536;

// Why `problem` is not one `family` can specialise: another op, a hidden size outside
// [1, kNormMaxHidden], an alignment that is not a power of two in [1, 16] bytes, flags beyond
// `allowed_flags` (named by `flag_names`), or an aux size; nullopt when it is.
std::optional<ArgumentError> norm_problem_error(const Family& family, const Problem& problem,
                                                std::uint32_t allowed_flags,
                                                std::string (*flag_names)(std::uint32_t));

struct FlagName {
  std::uint32_t bit;
  const char* name;  // with its value: "weight (1)"
};
// `flags` as the names of its bits in `names`, then any bit not among them by value ("unknown
// bits 64"), so an error never drops the bit that caused it; "none" when no bit is set.
std::string describe_flags(std::uint32_t flags, std::initializer_list<FlagName> names);

inline constexpr std::array<int, 4> kRowVecBytes = {16, 8, 4, 2};  // widest first: canonical
inline constexpr std::array<int, 9> kRowThreadsPerRow = {4, 8, 16, 32, 64, 128, 256, 512, 1024};
inline constexpr std::array<int, 5> kRowCtaThreads = {64, 128, 256, 512, 1024};

// Why `config`'s (vec_bytes, threads_per_row, cta_threads) cannot split `problem`'s rows on
// `device`, or empty when it can: the vector width against the dtype, the alignment and the
// row; threads per row (powers of two, or whole warps dividing the row's vectors, e.g. 928
// threads for the 1856 16-byte vectors of 14848 bf16 elements), none idle; `held` elements
// per thread (the family's count) at most `max_held`; the CTA a power-of-two multiple of the
// row group that the device can launch. Registers stay the family's own rule.
std::string row_split_reason(const Problem& problem, const Config& config,
                             const DeviceTraits& device, std::int64_t held, std::int64_t max_held);

// The splits of a row the space holds, ascending: the powers of two of kRowThreadsPerRow, and
// whole warps that divide the row's vec_bytes vectors exactly.
std::vector<int> row_split_options(const Problem& problem, int vec_bytes);

// The CTA sizes a split takes: every kRowCtaThreads size for a power-of-two split; the split
// times powers of two, up to the largest, for another.
std::vector<int> row_cta_options(int threads_per_row);

// Whether threads_per_row is the widest split the device allows (which stays valid even when
// it spills, so that every hidden size has a config).
bool is_widest_split(const Config& config, const DeviceTraits& device);

}  // namespace kiln
