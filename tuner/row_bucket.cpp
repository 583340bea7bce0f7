#include <algorithm>
#include <bit>
#include <cstdint>

#include "tuner/tuner.h"

namespace kiln {
namespace {

// A tuning run of the largest bucket should stream well past L2 (50 MB on an H100/H200), so
// it measures the DRAM-bound steady state that large calls run in.
constexpr std::int64_t kLargestBucketBytes = std::int64_t{256} << 20;
constexpr std::int64_t kLargestBucketCap = std::int64_t{1} << 22;

std::uint64_t pow2_ceil(std::int64_t value) {
  return std::bit_ceil(static_cast<std::uint64_t>(value));
}

}  // namespace

std::int64_t row_bucket(std::int64_t rows, std::int64_t largest) {
  if (rows <= 1) {
    return 1;
  }
  if (rows >= largest) {
    return largest;
  }
  return static_cast<std::int64_t>(pow2_ceil(rows));
}

std::int64_t largest_row_bucket(std::int64_t bytes_per_row) {
  if (bytes_per_row <= 0) {
    return kSmallestLargestBucket;
  }
  const std::int64_t rows = (kLargestBucketBytes + bytes_per_row - 1) / bytes_per_row;
  return std::clamp(static_cast<std::int64_t>(pow2_ceil(rows)), kSmallestLargestBucket,
                    kLargestBucketCap);
}

std::int64_t row_bucket(const Family& family, const Problem& problem, std::int64_t rows) {
  const std::int64_t sample = kSmallestLargestBucket;
  const std::int64_t bytes_per_row =
      (family.bytes_moved(problem, sample) - family.bytes_moved(problem, 0)) / sample;
  return row_bucket(rows, largest_row_bucket(bytes_per_row));
}

}  // namespace kiln
