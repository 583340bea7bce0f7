#include <doctest/doctest.h>

#include <bit>
#include <cstdint>

#include "tuner/tuner.h"

namespace kiln {

TEST_CASE("row buckets: documented examples") {
  CHECK(row_bucket(1) == 1);
  CHECK(row_bucket(2) == 2);
  CHECK(row_bucket(3) == 4);
  CHECK(row_bucket(5) == 8);
  CHECK(row_bucket(4096) == 4096);
  CHECK(row_bucket(4097) == 8192);
  CHECK(row_bucket(65536) == 65536);
}

TEST_CASE("row buckets: non-positive rows share the first bucket") {
  CHECK(row_bucket(0) == 1);
  CHECK(row_bucket(-1) == 1);
  CHECK(row_bucket(INT64_MIN) == 1);
}

TEST_CASE("row buckets stop growing at 2^16 rows") {
  CHECK(row_bucket(65537) == 65536);
  CHECK(row_bucket(1'000'000) == 65536);
  CHECK(row_bucket(INT64_MAX) == 65536);
}

TEST_CASE("row buckets: the smallest power of two holding the rows, below the cap") {
  for (std::int64_t rows = 1; rows <= 70'000; ++rows) {
    std::int64_t bucket = row_bucket(rows);
    if (rows > 65536) {
      REQUIRE(bucket == 65536);
      continue;
    }
    REQUIRE(std::has_single_bit(static_cast<std::uint64_t>(bucket)));
    REQUIRE(bucket >= rows);
    REQUIRE((bucket == 1 || bucket / 2 < rows));
  }
}

}  // namespace kiln
