#include "templates/norm_rules.h"

#include <algorithm>

#include "templates/config_rules.h"

namespace kiln {

std::optional<ArgumentError> norm_problem_error(const Family& family, const Problem& problem,
                                                std::uint32_t allowed_flags,
                                                std::string (*flag_names)(std::uint32_t)) {
  const std::string op(family.name());
  if (problem.op != family.op()) {
    return ArgumentError(op, "problem", "op " + op, std::string(op_name(problem.op)));
  }
  if (problem.hidden < 1 || problem.hidden > kNormMaxHidden) {
    return ArgumentError(op, "x", "hidden size in [1, 65536]", std::to_string(problem.hidden));
  }
  if (problem.align < 1 || problem.align > 16 || (problem.align & (problem.align - 1)) != 0) {
    return ArgumentError(op, "x", "alignment a power of two in [1, 16] bytes",
                         std::to_string(problem.align));
  }
  if ((problem.flags & ~allowed_flags) != 0) {
    return ArgumentError(op, "flags", "only " + flag_names(allowed_flags),
                         flag_names(problem.flags));
  }
  if (problem.aux != 0) {
    return ArgumentError(op, "aux", "0 (unused by the norm ops)", std::to_string(problem.aux));
  }
  return std::nullopt;
}

std::string describe_flags(std::uint32_t flags, std::initializer_list<FlagName> names) {
  std::string text;
  std::uint32_t named = 0;
  for (const FlagName& flag : names) {
    named |= flag.bit;
    if ((flags & flag.bit) != 0) {
      text += (text.empty() ? "" : ", ") + std::string(flag.name);
    }
  }
  if ((flags & ~named) != 0) {
    text +=
        (text.empty() ? "" : ", ") + std::string("unknown bits ") + std::to_string(flags & ~named);
  }
  return text.empty() ? "none" : text;
}

std::string row_split_reason(const Problem& problem, const Config& config,
                             const DeviceTraits& device, std::int64_t held, std::int64_t max_held) {
  const auto element = static_cast<std::int64_t>(dtype_size(problem.dtype));
  const std::string dtype(dtype_name(problem.dtype));
  const int vec = config.vec_bytes;
  if (!one_of(kRowVecBytes, vec)) {
    return "vec_bytes " + std::to_string(vec) + " is not " + list_of(kRowVecBytes);
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
  const std::int64_t vectors = row_bytes / vec;
  const bool exact_warps =
      tpr > 32 && tpr <= kRowThreadsPerRow.back() && tpr % 32 == 0 && vectors % tpr == 0;
  if (!one_of(kRowThreadsPerRow, tpr) && !exact_warps) {
    return "threads_per_row " + std::to_string(tpr) +
           " is neither a power of two in [4, 1024] nor whole warps dividing the row's " +
           std::to_string(vectors) + " vectors";
  }
  if (tpr != kRowThreadsPerRow.front() && tpr > vectors) {
    return "threads_per_row " + std::to_string(tpr) + " leaves threads idle: a row has only " +
           std::to_string(vectors) + " vectors of " + std::to_string(vec) + " bytes";
  }
  if (held > max_held) {
    return "each thread would hold " + std::to_string(held) + " elements of a row, more than " +
           std::to_string(max_held) + " (the register budget)";
  }

  const int cta = config.cta_threads;
  if (one_of(kRowThreadsPerRow, tpr) && !one_of(kRowCtaThreads, cta)) {
    return "cta_threads " + std::to_string(cta) + " is not " + list_of(kRowCtaThreads);
  }
  if (cta < tpr) {
    return "cta_threads " + std::to_string(cta) + " is fewer than threads_per_row " +
           std::to_string(tpr);
  }
  const int rows_per_cta = cta / tpr;
  if (cta % tpr != 0 || (rows_per_cta & (rows_per_cta - 1)) != 0) {
    return "cta_threads " + std::to_string(cta) +
           " is not a power-of-two multiple of threads_per_row " + std::to_string(tpr);
  }
  if (cta > device.max_threads_per_block) {
    return "cta_threads " + std::to_string(cta) + " exceeds the device's " +
           std::to_string(device.max_threads_per_block) + " threads per block";
  }
  return {};
}

std::vector<int> row_split_options(const Problem& problem, int vec_bytes) {
  std::vector<int> options(kRowThreadsPerRow.begin(), kRowThreadsPerRow.end());
  const std::int64_t row_bytes =
      problem.hidden * static_cast<std::int64_t>(dtype_size(problem.dtype));
  if (row_bytes % vec_bytes == 0) {
    const std::int64_t vectors = row_bytes / vec_bytes;
    for (int tpr = 64; tpr <= kRowThreadsPerRow.back(); tpr += 32) {
      if (vectors % tpr == 0 && !one_of(kRowThreadsPerRow, tpr)) {
        options.push_back(tpr);
      }
    }
  }
  std::sort(options.begin(), options.end());
  return options;
}

std::vector<int> row_cta_options(int threads_per_row) {
  if (one_of(kRowThreadsPerRow, threads_per_row)) {
    return {kRowCtaThreads.begin(), kRowCtaThreads.end()};
  }
  std::vector<int> options;
  for (int cta = threads_per_row; cta <= kRowCtaThreads.back(); cta *= 2) {
    options.push_back(cta);
  }
  return options;
}

bool is_widest_split(const Config& config, const DeviceTraits& device) {
  return config.threads_per_row >= std::min(kRowThreadsPerRow.back(), device.max_threads_per_block);
}

}  // namespace kiln
