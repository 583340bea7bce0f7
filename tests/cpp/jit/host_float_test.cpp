#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "jit/host_float.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace kiln::jit {

TEST_CASE("f16: exact values, rounding to nearest even, range ends") {
  CHECK(float_to_f16_bits(0.0f) == 0x0000);
  CHECK(float_to_f16_bits(-0.0f) == 0x8000);
  CHECK(float_to_f16_bits(1.0f) == 0x3C00);
  CHECK(float_to_f16_bits(-2.0f) == 0xC000);
  CHECK(float_to_f16_bits(65504.0f) == 0x7BFF);  // largest finite
  CHECK(float_to_f16_bits(65519.0f) == 0x7BFF);  // below the halfway point to 65536
  CHECK(float_to_f16_bits(65520.0f) == 0x7C00);  // halfway, ties to even: overflows to inf
  CHECK(float_to_f16_bits(std::numeric_limits<float>::infinity()) == 0x7C00);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even neighbour, 1.
  CHECK(float_to_f16_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9: rounds up to even.
  CHECK(float_to_f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);
  CHECK(float_to_f16_bits(std::ldexp(1.0f, -24)) == 0x0001);  // least subnormal
  CHECK(float_to_f16_bits(std::ldexp(1.0f, -25)) == 0x0000);  // half of it: tie to 0
  CHECK(float_to_f16_bits(std::ldexp(1.5f, -25)) == 0x0001);  // above half: rounds up
  CHECK(float_to_f16_bits(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 units: tie to even 2
  CHECK(float_to_f16_bits(std::ldexp(1.0f, -14)) == 0x0400);  // least normal
  const std::uint16_t nan = float_to_f16_bits(std::numeric_limits<float>::quiet_NaN());
  CHECK((nan & 0x7C00) == 0x7C00);
  CHECK((nan & 0x03FF) != 0);
}

TEST_CASE("f16: every finite half survives a round trip through float") {
  for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const auto half = static_cast<std::uint16_t>(bits);
    const float value = f16_bits_to_float(half);
    if ((half & 0x7C00) == 0x7C00 && (half & 0x03FF) != 0) {
      REQUIRE(std::isnan(value));
      continue;
    }
    REQUIRE(float_to_f16_bits(value) == half);
  }
  CHECK(f16_bits_to_float(0x3555) == 0.333251953125f);  // 0.25 * (1 + 341/1024)
  CHECK(f16_bits_to_float(0x0001) == std::ldexp(1.0f, -24));
}

#if defined(__FLT16_MAX__)
TEST_CASE("f16: narrowing agrees with the compiler's _Float16 on many floats") {
  std::uint64_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    // Mostly values near the half range, including subnormals and overflow.
    const float value =
        std::ldexp(static_cast<float>(static_cast<std::int32_t>(state >> 32)) / 2147483648.0f,
                   static_cast<int>((state >> 8) % 44) - 28);
    const _Float16 reference = static_cast<_Float16>(value);
    REQUIRE(float_to_f16_bits(value) == std::bit_cast<std::uint16_t>(reference));
  }
}

TEST_CASE("f16: widening agrees with the compiler's _Float16 on every half") {
  for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const auto half = static_cast<std::uint16_t>(bits);
    const float reference = static_cast<float>(std::bit_cast<_Float16>(half));
    const float value = f16_bits_to_float(half);
    if (std::isnan(reference)) {
      REQUIRE(std::isnan(value));  // (a signalling NaN's quiet bit may differ)
      REQUIRE(std::signbit(value) == std::signbit(reference));
      continue;
    }
    REQUIRE(std::bit_cast<std::uint32_t>(value) == std::bit_cast<std::uint32_t>(reference));
  }
}
#endif

#if defined(__SSE__)
TEST_CASE("f16: subnormal halves widen right where the thread flushes denormals") {
  // torch.set_flush_denormal(True) sets these bits (FTZ, DAZ) on the calling thread, which
  // is the thread that checks a tune's outputs.
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);
  const float least = f16_bits_to_float(0x0001);
  const float largest = f16_bits_to_float(0x83FF);
  _mm_setcsr(saved);
  CHECK(least == std::ldexp(1.0f, -24));
  CHECK(largest == -std::ldexp(1023.0f, -24));
}
#endif

TEST_CASE("bf16: exact values, rounding to nearest even, NaN") {
  CHECK(float_to_bf16_bits(1.0f) == 0x3F80);
  CHECK(float_to_bf16_bits(-1.0f) == 0xBF80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even, 1.
  CHECK(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up to even.
  CHECK(float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);
  CHECK(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) == 0x3F81);
  CHECK(float_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7F80);  // rounds to inf
  CHECK(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::nanf("")))));
  // A NaN whose payload sits only in the low bits must not become inf.
  CHECK(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::bit_cast<float>(0x7F800001u)))));
  for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const auto b = static_cast<std::uint16_t>(bits);
    const float value = bf16_bits_to_float(b);
    if (std::isnan(value)) continue;
    REQUIRE(float_to_bf16_bits(value) == b);
  }
}

}  // namespace kiln::jit
