// Arithmetic and rules every family descriptor shares when it enumerates and checks its
// configs: membership in a tunable's list of values, ceilings, the alignment a problem
// guarantees, the one-pass grid that covers a number of rows, and the persistent grids
// (extra["grid"]) of the families whose kernels prefetch their next rows. Plain C++, no CUDA.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "templates/types.h"

namespace kiln {

template <std::size_t N>
bool one_of(const std::array<int, N>& values, std::int64_t value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// "16, 8, 4 or 2": a tunable's values, for error messages.
template <std::size_t N>
std::string list_of(const std::array<int, N>& values) {
  std::string text;
  for (std::size_t i = 0; i < N; ++i) {
    text += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::to_string(values[i]);
  }
  return text;
}

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// The smallest k with 2^k >= value.
constexpr int log2_ceil(int value) {
  int log = 0;
  while ((1 << log) < value) ++log;
  return log;
}

// An element is always aligned to its own size (CUDA and torch guarantee it), so a smaller
// Problem::align only says that nothing wider is known.
inline std::int64_t effective_align(const Problem& problem) {
  return std::max<std::int64_t>(problem.align,
                                static_cast<std::int64_t>(dtype_size(problem.dtype)));
}

// The alignment of a model's call whose operands are whole allocations (16-byte aligned) in
// rows of these byte widths: the host takes every operand's address and row stride into a
// problem's alignment, so a row that is not whole 16-byte multiples lowers it (a norm's row of
// a width that is not a multiple of 8 bf16 elements; MiniMax-M3-VL's [S, 78] bf16 RoPE tables).
// What `kiln prewarm` compiles a model's calls at, so that their first call finds them.
inline std::uint32_t row_alignment(std::initializer_list<std::int64_t> row_bytes) {
  std::uint32_t align = 16;
  for (const std::int64_t bytes : row_bytes) {
    while (align > 1 && bytes % align != 0) {
      align /= 2;
    }
  }
  return align;
}

// The bytes of a row of `elements` elements of `dtype`.
inline std::int64_t row_bytes(DType dtype, std::int64_t elements) {
  return elements * static_cast<std::int64_t>(dtype_size(dtype));
}

// The most CTAs a launch's grid takes in x.
inline constexpr std::int64_t kMaxGridCtas = 0x7fffffff;

// CTAs of `rows_per_cta` rows covering `rows` rows, clamped to what a launch accepts (a
// kernel's grid-stride loop, where it has one, covers the rest).
inline std::uint32_t covering_grid(std::int64_t rows, std::int64_t rows_per_cta) {
  return static_cast<std::uint32_t>(std::clamp<std::int64_t>(
      ceil_div(std::max<std::int64_t>(rows, 0), std::max<std::int64_t>(rows_per_cta, 1)), 1,
      kMaxGridCtas));
}

// extra["grid"]: 0 (or absent) covers the rows in one pass; N > 0 launches N CTAs whose
// threads prefetch their next rows.
inline std::int64_t persistent_grid_of(const Config& config) {
  return config.extra_or("grid", 0);
}

// CTAs of `cta_threads` threads that an SM holds at once, by its threads and an estimate of
// each thread's registers (allocated per warp in units of 256, 8 per thread, up to 255),
// clamped to [1, 16]: a persistent grid never needs more to fill an SM.
inline std::int64_t resident_ctas(std::int64_t registers_per_thread, int cta_threads,
                                  const DeviceTraits& device) {
  constexpr std::int64_t kGranule = 8;
  constexpr std::int64_t kMaxRegisters = 255;
  constexpr std::int64_t kMaxResident = 16;
  const std::int64_t registers =
      ceil_div(std::min(registers_per_thread, kMaxRegisters), kGranule) * kGranule;
  const std::int64_t by_threads = device.max_threads_per_sm / cta_threads;
  const std::int64_t by_registers = device.regs_per_sm / (registers * cta_threads);
  return std::clamp<std::int64_t>(std::min(by_threads, by_registers), 1, kMaxResident);
}

// Why `grid` is not a persistent grid of a config of which an SM holds `resident` CTAs (the
// SM count times that, or twice it: the estimate is conservative, and a grid short of what
// fits idles SMs); empty when it is, or when it is 0.
inline std::string persistent_grid_reason(std::int64_t grid, std::int64_t resident,
                                          const DeviceTraits& device) {
  if (grid < 0) return "grid " + std::to_string(grid) + " is negative";
  const std::int64_t persistent = std::int64_t{device.sm_count} * resident;
  if (grid == 0 || grid == persistent || grid == 2 * persistent) return {};
  return "grid " + std::to_string(grid) + " is not a persistent grid of this config (" +
         std::to_string(persistent) + " = " + std::to_string(device.sm_count) + " SMs x " +
         std::to_string(resident) + " resident CTAs, or twice that)";
}

// Gives `config` a persistent grid of `waves` times the SM count times resident_of(config),
// the CTAs an SM holds of it, asked once the config is marked persistent (prefetching
// takes registers, so residency depends on it).
template <typename ResidentOf>
void size_persistent_grid(Config& config, int waves, const DeviceTraits& device,
                          ResidentOf resident_of) {
  config.extra["grid"] = 1;
  config.extra["grid"] = waves * std::int64_t{device.sm_count} * resident_of(config);
}

// A persistent grid caps the covering grid; the kernel's grid-stride loop covers the rest.
inline std::uint32_t capped_grid(std::uint32_t covering, const Config& config) {
  const std::int64_t cap = persistent_grid_of(config);
  return cap > 0 && covering > cap ? static_cast<std::uint32_t>(cap) : covering;
}

}  // namespace kiln
