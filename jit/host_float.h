// IEEE half and bfloat16 on the host, as raw 16-bit patterns: for filling a GPU buffer with
// inputs and reading outputs back. Narrowing rounds to nearest, ties to even (as the GPU's
// cvt.rn and torch's .to() do); NaN stays NaN.
#pragma once

#include <cstdint>

namespace kiln::jit {

std::uint16_t float_to_f16_bits(float value);
float f16_bits_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16_bits(float value);
float bf16_bits_to_float(std::uint16_t bits);

}  // namespace kiln::jit
