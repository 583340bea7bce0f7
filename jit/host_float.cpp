#include "jit/host_float.h"

#include <bit>

namespace kiln::jit {

std::uint16_t float_to_f16_bits(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) {
    return static_cast<std::uint16_t>(sign | 0x7E00u);  // NaN
  }
  if (magnitude >= 0x477FF000u) {
    return static_cast<std::uint16_t>(sign | 0x7C00u);  // to inf
  }
  const int exponent = static_cast<int>(magnitude >> 23) - 127;
  if (exponent >= -14) {
    // Normal half: drop 13 mantissa bits, rounding to nearest even; a carry into the exponent
    // is the correct result (the inf case was handled above).
    std::uint32_t half =
        ((static_cast<std::uint32_t>(exponent + 15)) << 10) | ((magnitude >> 13) & 0x3FFu);
    const std::uint32_t rest = magnitude & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) {
      ++half;
    }
    return static_cast<std::uint16_t>(sign | half);
  }
  if (exponent < -25) {
    return static_cast<std::uint16_t>(sign);  // below half the least subnormal
  }
  // Subnormal half: the value in units of 2^-24, rounded to nearest even.
  const std::uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;  // implicit 1
  const int shift = -exponent - 1;  // 14..24: 2^exponent * m/2^23 / 2^-24 = m >> (-1 - exponent)
  std::uint32_t half = mantissa >> shift;
  const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (half & 1u))) {
    ++half;
  }
  return static_cast<std::uint16_t>(sign | half);
}

std::uint16_t float_to_bf16_bits(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  const std::uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

}  // namespace kiln::jit
