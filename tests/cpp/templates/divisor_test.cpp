#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "templates/kiln/divisor.cuh"

namespace {

constexpr unsigned long long kMax = std::numeric_limits<unsigned long long>::max();

// Numerators where a wrong magic or shift shows first: around multiples of d, powers of two
// and the top of the range.
std::vector<unsigned long long> edge_numerators(unsigned long long d) {
  std::vector<unsigned long long> result = {0, 1, 2, kMax, kMax - 1, kMax / 2, kMax / 2 + 1};
  for (unsigned long long k : {1ull, 2ull, 3ull, 1000ull, 1ull << 31, 1ull << 32}) {
    const unsigned long long multiple = d * k;
    if (multiple / k != d) {  // d * k overflows
      continue;
    }
    result.push_back(multiple - 1);
    result.push_back(multiple);
    if (multiple != kMax) {
      result.push_back(multiple + 1);
    }
  }
  for (int bit = 0; bit < 64; ++bit) {
    result.push_back(1ull << bit);
    result.push_back((1ull << bit) - 1);
  }
  return result;
}

// The 32-bit quotient, for the numerator's low word (every 64-bit edge has one).
void check_narrow(unsigned long long n, unsigned long long d, const kiln::Divisor& divisor) {
  const auto narrow = static_cast<unsigned int>(n);
  REQUIRE(kiln::quotient(narrow, divisor) == narrow / d);
}

void check_divisor(unsigned long long d, std::mt19937_64& random) {
  const kiln::Divisor divisor = kiln::make_divisor(d);
  for (unsigned long long n : edge_numerators(d)) {
    INFO("d = " << d << ", n = " << n);
    REQUIRE(kiln::quotient(n, divisor) == n / d);
    check_narrow(n, d, divisor);
  }
  for (int i = 0; i < 200; ++i) {
    const unsigned long long n = random() >> (i % 64);  // all magnitudes
    INFO("d = " << d << ", n = " << n);
    REQUIRE(kiln::quotient(n, divisor) == n / d);
    check_narrow(n, d, divisor);
  }
}

}  // namespace

TEST_CASE("the magic divisor gives the exact quotient") {
  std::mt19937_64 random(20261122);
  SUBCASE("small divisors, powers of two and their neighbours") {
    for (unsigned long long d = 1; d <= 4096; ++d) {
      check_divisor(d, random);
    }
    for (int bit = 0; bit < 64; ++bit) {
      const unsigned long long power = 1ull << bit;
      check_divisor(power, random);
      check_divisor(power + 1, random);
      if (power > 2) {
        check_divisor(power - 1, random);
      }
    }
    check_divisor(kMax, random);
  }
  SUBCASE("rows per sample of real calls and random divisors") {
    for (unsigned long long d : {2688ull, 8064ull, 16128ull, 4608ull, 4095ull, 77ull}) {
      check_divisor(d, random);
    }
    for (int i = 0; i < 2000; ++i) {
      check_divisor((random() >> (i % 64)) | 1, random);
    }
  }
}

TEST_CASE("a divisor below one is taken as one") {
  const kiln::Divisor divisor = kiln::make_divisor(0);
  CHECK(kiln::quotient(12345ull, divisor) == 12345);
  CHECK(kiln::quotient(12345u, divisor) == 12345);
  CHECK(kiln::quotient(kMax, divisor) == kMax);
}
