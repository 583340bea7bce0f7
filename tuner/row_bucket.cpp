#include <bit>
#include <cstdint>

#include "tuner/tuner.h"

namespace kiln {
namespace {

constexpr std::int64_t kLargestBucket = std::int64_t{1} << 16;

}  // namespace

std::int64_t row_bucket(std::int64_t rows) {
  if (rows <= 1) return 1;
  if (rows >= kLargestBucket) return kLargestBucket;
  return static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(rows)));
}

}  // namespace kiln
