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
// how many elements disagree), or nullopt when every element agrees. An element may differ
// by tolerance(dtype) * max(sqrt(summed_terms), |expected|): an output that adds up n terms
// of about unit size rounds differently in another order by about sqrt(n) units in the last
// place of the running sum, whatever the sum comes to (an fp32 sum of 3001 such terms,
// reordered, moved near-zero results by 4e-5, four times fp32's allowance at 1).
std::optional<std::string> compare_outputs(DType dtype, std::span<const char> got,
                                           std::span<const char> expected,
                                           std::int64_t summed_terms = 1);

struct TimingSummary {
  double median_us = 0;
  double spread_us = 0;  // interquartile range
};

// Median and interquartile range (linear interpolation between order statistics).
TimingSummary summarize(std::vector<double> samples_us);

}  // namespace kiln::jit
