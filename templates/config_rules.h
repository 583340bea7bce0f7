// Arithmetic and rules every family descriptor shares when it enumerates and checks its
// configs: membership in a tunable's list of values, ceilings, the alignment a problem
// guarantees, and the one-pass grid that covers a number of rows. Plain C++, no CUDA.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "templates/types.h"

namespace kiln {

template <std::size_t N>
bool one_of(const std::array<int, N>& values, std::int64_t value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// "16, 8, 4 or 2": a tunable's values, for error messages.
template <std::size_t N>
std::string list_of(const std::array<int, N>& values) {
  std::string text;
  for (std::size_t i = 0; i < N; ++i) {
    text += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::to_string(values[i]);
  }
  return text;
}

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// The smallest k with 2^k >= value.
constexpr int log2_ceil(int value) {
  int log = 0;
  while ((1 << log) < value) ++log;
  return log;
}

// An element is always aligned to its own size (CUDA and torch guarantee it), so a smaller
// Problem::align only says that nothing wider is known.
inline std::int64_t effective_align(const Problem& problem) {
  return std::max<std::int64_t>(problem.align,
                                static_cast<std::int64_t>(dtype_size(problem.dtype)));
}

// CTAs of `rows_per_cta` rows covering `rows` rows, clamped to what a launch accepts (a
// kernel's grid-stride loop covers the rest).
inline std::uint32_t covering_grid(std::int64_t rows, std::int64_t rows_per_cta) {
  constexpr std::int64_t kMaxGrid = 0x7fffffff;
  return static_cast<std::uint32_t>(std::clamp<std::int64_t>(
      ceil_div(std::max<std::int64_t>(rows, 0), std::max<std::int64_t>(rows_per_cta, 1)), 1,
      kMaxGrid));
}

}  // namespace kiln
