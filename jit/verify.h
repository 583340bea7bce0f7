// The host side of evaluating a candidate: deterministic inputs, comparing an output with
// the reference's, and summarising repeated timings. No CUDA here, so all of it is tested
// without a GPU.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "templates/types.h"

namespace kiln::jit {

// `elements` values uniform in [-1, 1), rounded to `dtype`, as the bytes a GPU buffer holds.
// The same seed gives the same bytes on every machine.
std::vector<char> random_values(DType dtype, std::int64_t elements, std::uint64_t seed);

// Element `index` of a buffer of `dtype`, widened to float.
float element(DType dtype, std::span<const char> bytes, std::int64_t index);

// The relative tolerance a candidate must meet against the reference, of max(1, |ref|):
// a few units in the last place of the dtype (fp32 1e-5, fp16 2e-3, bf16 1.6e-2).
double tolerance(DType dtype);

// Why `got` disagrees with `expected` (the first element out of tolerance, or a NaN, and
// how many elements disagree), or nullopt when every element agrees.
std::optional<std::string> compare_outputs(DType dtype, std::span<const char> got,
                                           std::span<const char> expected);

struct TimingSummary {
  double median_us = 0;
  double spread_us = 0;  // interquartile range
};

// Median and interquartile range (linear interpolation between order statistics).
TimingSummary summarize(std::vector<double> samples_us);

}  // namespace kiln::jit
