#include "templates/rms_norm_family.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "cache/error.h"
#include "templates/kiln/rms_norm_params.cuh"

namespace kiln {

// The kernel receives these bytes as its by-value parameter; nvcc lays the struct out the
// same way for the device (8-byte pointers and long longs), 56 bytes with the tail padding.
static_assert(sizeof(RmsNormParams) == 56 && alignof(RmsNormParams) == 8);

namespace {

constexpr std::array<int, 4> kVecBytes = {16, 8, 4, 2};  // widest first: the canonical order
constexpr std::array<int, 9> kThreadsPerRow = {4, 8, 16, 32, 64, 128, 256, 512, 1024};
constexpr std::array<int, 5> kCtaThreads = {64, 128, 256, 512, 1024};

// Registers a thread needs beyond the row it holds (addresses, indices, the reduction),
// calibrated on ptxas -v of sm_75 and sm_90 builds: up to 64 held elements the kernel uses
// at most this many more registers than elements without spilling.
constexpr int kRegisterOverhead = 32;
constexpr int kMaxRegistersPerThread = 255;

// The heuristic's target: TE's tuned RMSNorm launch configs give each thread 24..64
// elements; 32 keeps several 16-byte loads in flight per thread while leaving the
// registers for 2+ CTAs per SM.
constexpr std::int64_t kTargetElementsPerThread = 32;
// Short rows are packed several to a CTA, so a CTA is never a handful of warps.
constexpr int kTargetRowsPerCta = 4;
constexpr int kMinHeuristicCta = 128;
constexpr int kMaxHeuristicCtaForShortRows = 256;

template <std::size_t N>
bool one_of(const std::array<int, N>& values, int value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

template <std::size_t N>
std::string list(const std::array<int, N>& values) {
  std::string text;
  for (std::size_t i = 0; i < N; ++i) {
    text += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::to_string(values[i]);
  }
  return text;
}

bool has_weight(const Problem& problem) {
  return (problem.flags & kRmsNormHasWeight) != 0;
}

// An element is always aligned to its own size (CUDA and torch guarantee it), so a smaller
// `align` only says that nothing wider is known.
std::int64_t effective_align(const Problem& problem) {
  return std::max<std::int64_t>(problem.align,
                                static_cast<std::int64_t>(dtype_size(problem.dtype)));
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

int log2_of(int power_of_two) {
  int log = 0;
  while ((1 << log) < power_of_two) ++log;
  return log;
}

std::optional<ArgumentError> problem_error(const Problem& problem) {
  if (problem.op != Op::rms_norm) {
    return ArgumentError("rms_norm", "problem", "op rms_norm", std::string(op_name(problem.op)));
  }
  if (problem.hidden < 1 || problem.hidden > RmsNormFamily::kMaxHidden) {
    return ArgumentError("rms_norm", "x", "hidden size in [1, 65536]",
                         std::to_string(problem.hidden));
  }
  if (problem.align < 1 || problem.align > 16 || (problem.align & (problem.align - 1)) != 0) {
    return ArgumentError("rms_norm", "x", "alignment a power of two in [1, 16] bytes",
                         std::to_string(problem.align));
  }
  if ((problem.flags & ~kRmsNormHasWeight) != 0) {
    return ArgumentError("rms_norm", "flags", "only the has-weight bit (1)",
                         std::to_string(problem.flags));
  }
  return std::nullopt;
}

}  // namespace

std::int64_t RmsNormFamily::elements_per_thread(const Problem& problem, const Config& config) {
  const std::int64_t vec_elems = std::max<std::int64_t>(
      1, config.vec_bytes / static_cast<std::int64_t>(dtype_size(problem.dtype)));
  const std::int64_t per_step = vec_elems * std::max(1, config.threads_per_row);
  return ceil_div(problem.hidden, per_step) * vec_elems;
}

void RmsNormFamily::check(const Problem& problem) const {
  if (auto error = problem_error(problem)) throw *error;
}

std::string RmsNormFamily::invalid_reason(const Problem& problem, const Config& config,
                                          const DeviceTraits& device) const {
  if (auto error = problem_error(problem)) return error->message();
  if (!config.extra.empty()) {
    return "rms_norm has no tunable named '" + config.extra.begin()->first + "'";
  }

  const auto element = static_cast<std::int64_t>(dtype_size(problem.dtype));
  const std::string dtype(dtype_name(problem.dtype));
  const int vec = config.vec_bytes;
  if (!one_of(kVecBytes, vec)) {
    return "vec_bytes " + std::to_string(vec) + " is not " + list(kVecBytes);
  }
  if (vec < element) {
    return "vec_bytes " + std::to_string(vec) + " is narrower than one " + dtype + " element (" +
           std::to_string(element) + " bytes)";
  }
  if (vec > effective_align(problem)) {
    return "vec_bytes " + std::to_string(vec) + " exceeds the data alignment " +
           std::to_string(effective_align(problem));
  }
  const std::int64_t row_bytes = problem.hidden * element;
  if (row_bytes % vec != 0) {
    return "a row of " + std::to_string(problem.hidden) + " " + dtype + " elements (" +
           std::to_string(row_bytes) + " bytes) is not a whole number of " + std::to_string(vec) +
           "-byte vectors";
  }

  const int tpr = config.threads_per_row;
  if (!one_of(kThreadsPerRow, tpr)) {
    return "threads_per_row " + std::to_string(tpr) + " is not a power of two in [4, 1024]";
  }
  const std::int64_t vectors = row_bytes / vec;
  // The narrowest split is always allowed, so that the tiniest rows have a config.
  if (tpr != kThreadsPerRow.front() && tpr > vectors) {
    return "threads_per_row " + std::to_string(tpr) + " leaves threads idle: a row has only " +
           std::to_string(vectors) + " vectors of " + std::to_string(vec) + " bytes";
  }
  const std::int64_t held = elements_per_thread(problem, config);
  if (held > kMaxElementsPerThread) {
    return "each thread would hold " + std::to_string(held) + " elements of a row, more than " +
           std::to_string(kMaxElementsPerThread) + " (the register budget)";
  }

  const int cta = config.cta_threads;
  if (!one_of(kCtaThreads, cta)) {
    return "cta_threads " + std::to_string(cta) + " is not " + list(kCtaThreads);
  }
  if (cta < tpr) {
    return "cta_threads " + std::to_string(cta) + " is fewer than threads_per_row " +
           std::to_string(tpr);
  }
  if (cta > device.max_threads_per_block) {
    return "cta_threads " + std::to_string(cta) + " exceeds the device's " +
           std::to_string(device.max_threads_per_block) + " threads per block";
  }
  // __launch_bounds__(cta) caps a thread's registers; a row that does not fit spills to local
  // memory. The widest split the device allows is exempt: nothing holds the row in fewer
  // registers, so it stays available (slow but correct) for the widest rows.
  const int register_cap =
      std::min(kMaxRegistersPerThread, std::max(1, device.regs_per_block / cta));
  const std::int64_t registers = held + kRegisterOverhead;
  if (registers > register_cap &&
      tpr < std::min(kThreadsPerRow.back(), device.max_threads_per_block)) {
    return "holding " + std::to_string(held) + " elements needs about " +
           std::to_string(registers) + " registers per thread, more than the " +
           std::to_string(register_cap) + " a " + std::to_string(cta) + "-thread CTA allows";
  }
  return {};
}

std::vector<Config> RmsNormFamily::space(const Problem& problem, const DeviceTraits& device) const {
  check(problem);
  std::vector<Config> configs;
  for (int vec : kVecBytes) {
    for (int tpr : kThreadsPerRow) {
      for (int cta : kCtaThreads) {
        Config config;
        config.vec_bytes = vec;
        config.threads_per_row = tpr;
        config.cta_threads = cta;
        if (invalid_reason(problem, config, device).empty()) configs.push_back(std::move(config));
      }
    }
  }
  return configs;
}

// The widest vector, then the valid split and CTA nearest (in powers of two) to the targets:
// about kTargetElementsPerThread elements per thread and kTargetRowsPerCta rows per CTA for
// short rows. Chosen from space(), so it is valid by construction.
Config RmsNormFamily::heuristic(const Problem& problem, const DeviceTraits& device) const {
  const std::vector<Config> configs = space(problem, device);
  if (configs.empty()) {
    throw Error("kiln.rms_norm: no valid launch config for " + problem.key() + " on sm_" +
                std::to_string(device.sm));
  }
  const int vec = configs.front().vec_bytes;

  Config target;
  target.vec_bytes = vec;
  target.threads_per_row = kThreadsPerRow.back();
  for (int tpr : kThreadsPerRow) {
    target.threads_per_row = tpr;
    if (elements_per_thread(problem, target) <= kTargetElementsPerThread) break;
  }
  target.cta_threads = std::max(
      {kMinHeuristicCta, target.threads_per_row,
       std::min(kTargetRowsPerCta * target.threads_per_row, kMaxHeuristicCtaForShortRows)});

  const int target_tpr_log = log2_of(target.threads_per_row);
  const int target_cta_log = log2_of(target.cta_threads);
  const Config* best = nullptr;
  auto distance = [&](const Config& c) {
    const int tpr_log = log2_of(c.threads_per_row);
    // Ties go to the wider split: it holds fewer registers per thread.
    return std::array<int, 3>{std::abs(tpr_log - target_tpr_log), -tpr_log,
                              std::abs(log2_of(c.cta_threads) - target_cta_log)};
  };
  for (const Config& config : configs) {
    if (config.vec_bytes != vec) continue;
    if (best == nullptr || distance(config) < distance(*best)) best = &config;
  }
  return *best;
}

std::string RmsNormFamily::name_expression(const Problem& problem, const Config& config) const {
  return "kiln::rms_norm<" + std::string(dtype_cuda_type(problem.dtype)) + ", " +
         std::to_string(problem.hidden) + ", " + std::to_string(config.vec_bytes) + ", " +
         std::to_string(config.threads_per_row) + ", " + std::to_string(config.cta_threads) + ", " +
         (has_weight(problem) ? "true" : "false") + ">";
}

// The reduction's shared memory is static (sized by the template), so none is dynamic.
LaunchGeometry RmsNormFamily::geometry(const Problem& problem, const Config& config,
                                       std::int64_t rows) const {
  constexpr std::int64_t kMaxGrid = 0x7fffffff;
  const std::int64_t rows_per_cta = std::max(1, config.rows_per_cta());
  LaunchGeometry geometry;
  geometry.grid[0] = static_cast<std::uint32_t>(std::clamp<std::int64_t>(
      ceil_div(std::max<std::int64_t>(rows, 0), rows_per_cta), 1, kMaxGrid));
  geometry.block[0] = static_cast<std::uint32_t>(config.cta_threads);
  geometry.smem_bytes = 0;
  return geometry;
}

std::vector<BufferSpec> RmsNormFamily::buffers(const Problem& problem, std::int64_t rows) const {
  check(problem);
  if (rows < 0) throw ArgumentError("rms_norm", "rows", "a count >= 0", std::to_string(rows));
  std::vector<BufferSpec> specs;
  specs.push_back({"x", problem.dtype, rows * problem.hidden, false});
  if (has_weight(problem)) specs.push_back({"weight", problem.dtype, problem.hidden, false});
  specs.push_back({"out", problem.dtype, rows * problem.hidden, true});
  return specs;
}

std::vector<std::byte> RmsNormFamily::pack_params(const Problem& problem, std::int64_t rows,
                                                  std::span<const std::uint64_t> addresses) const {
  const std::size_t expected = has_weight(problem) ? 3 : 2;
  if (addresses.size() != expected) {
    throw Error("kiln.rms_norm: pack_params: expected " + std::to_string(expected) +
                " addresses (" + (has_weight(problem) ? "x, weight, out" : "x, out") + "), got " +
                std::to_string(addresses.size()));
  }
  // Zeroed first, so the padding bytes are deterministic too.
  RmsNormParams params;
  std::memset(&params, 0, sizeof(params));
  params.x = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(addresses[0]));
  if (has_weight(problem)) {
    params.weight = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(addresses[1]));
  }
  params.out = reinterpret_cast<void*>(static_cast<std::uintptr_t>(addresses.back()));
  params.rows = rows;
  params.x_row_stride = problem.hidden;
  params.out_row_stride = problem.hidden;
  params.eps = kDefaultEps;

  std::vector<std::byte> bytes(sizeof(params));
  std::memcpy(bytes.data(), &params, sizeof(params));
  return bytes;
}

std::int64_t RmsNormFamily::bytes_moved(const Problem& problem, std::int64_t rows) const {
  const std::int64_t elements =
      2 * rows * problem.hidden + (has_weight(problem) ? problem.hidden : 0);
  return elements * static_cast<std::int64_t>(dtype_size(problem.dtype));
}

std::vector<Problem> RmsNormFamily::common_problems(DType dtype, std::int64_t hidden) const {
  Problem with_weight{Op::rms_norm, dtype, hidden, kRmsNormHasWeight, 16};
  Problem without_weight{Op::rms_norm, dtype, hidden, 0u, 16};
  return {with_weight, without_weight};
}

}  // namespace kiln
