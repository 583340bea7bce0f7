// IEEE half and bfloat16 on the host, as raw 16-bit patterns: for filling a GPU buffer with
// inputs and reading outputs back. Narrowing rounds to nearest, ties to even (as the GPU's
// cvt.rn and torch's .to() do); NaN stays NaN.
#pragma once

#include <bit>
#include <cstdint>

namespace kiln::jit {

std::uint16_t float_to_f16_bits(float value);
std::uint16_t float_to_bf16_bits(float value);

// Widening is exact, and written without branches (selects only) so that a loop over
// millions of outputs, as the tuner's check is, vectorizes. Subnormal halves are converted
// from their integer mantissa: no float denormal is formed, so a thread that flushes
// denormals (torch.set_flush_denormal) still reads them right.
inline float f16_bits_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = bits & 0x7C00u;
  const std::uint32_t magnitude = bits & 0x7FFFu;
  // Normal: the half's exponent and mantissa shifted into a float's, the bias moved by 112.
  const std::uint32_t normal = (magnitude << 13) + (112u << 23);
  const std::uint32_t subnormal =
      std::bit_cast<std::uint32_t>(static_cast<float>(bits & 0x3FFu) * 0x1p-24f);
  const std::uint32_t special = (magnitude << 13) | 0x7F800000u;  // inf, NaN with its payload
  const std::uint32_t value = exponent == 0 ? subnormal : exponent == 0x7C00u ? special : normal;
  return std::bit_cast<float>(sign | value);
}

inline float bf16_bits_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

}  // namespace kiln::jit
