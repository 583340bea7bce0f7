#include <doctest/doctest.h>

#include <bit>
#include <cstdint>

#include "templates/family.h"
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

TEST_CASE("row buckets: a larger cap holds powers of two up to it") {
  CHECK(row_bucket(65537, std::int64_t{1} << 19) == 131072);
  CHECK(row_bucket(655360, std::int64_t{1} << 19) == 524288);
  CHECK(row_bucket(3, std::int64_t{1} << 19) == 4);
}

TEST_CASE("the largest bucket moves at least 256 MB, within [2^16, 2^22] rows") {
  // Norm rows of 4096 bf16 (x read, y written: 16 KB) reach it well before 2^16 rows.
  CHECK(largest_row_bucket(16384) == 65536);
  // RoPE's rows are one head of 128 bf16, read and written (512 bytes): 2^19 rows.
  CHECK(largest_row_bucket(512) == 524288);
  CHECK(largest_row_bucket(1) == std::int64_t{1} << 22);
  CHECK(largest_row_bucket(0) == 65536);
  for (std::int64_t bytes : {1, 7, 100, 512, 513, 4096, 1 << 20}) {
    const std::int64_t largest = largest_row_bucket(bytes);
    REQUIRE(std::has_single_bit(static_cast<std::uint64_t>(largest)));
    if (largest < (std::int64_t{1} << 22)) REQUIRE(largest * bytes >= (std::int64_t{256} << 20));
    if (largest > 65536) REQUIRE(largest / 2 * bytes < (std::int64_t{256} << 20));
  }
}

TEST_CASE("a family's problem gets the largest bucket of its bytes per row") {
  const Problem rope{Op::rope, DType::bf16, 128, 0u, 16};
  const Problem norm{Op::rms_norm, DType::bf16, 4096, 0u, 16};
  // Llama-3-8B prefill of 8 x 2048 tokens, 32 + 8 heads: 655360 rows of one head.
  CHECK(row_bucket(family(Op::rope), rope, 655360) == 524288);
  CHECK(row_bucket(family(Op::rope), rope, 100000) == 131072);
  CHECK(row_bucket(family(Op::rms_norm), norm, 1'000'000) == 65536);
  for (std::int64_t rows : {0, 1, 3, 4097, 65536}) {
    CHECK(row_bucket(family(Op::rope), rope, rows) == row_bucket(rows));
  }
}

}  // namespace kiln
