#include "templates/norm_backward_family.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "cache/error.h"
#include "templates/config_rules.h"
#include "templates/kiln/norm_backward_params.cuh"
#include "templates/norm_rules.h"

namespace kiln {

// The kernel receives these bytes as its by-value parameter; nvcc lays the struct out the
// same way for the device (8-byte pointers and long longs).
static_assert(sizeof(NormBackwardParams) == 176 && alignof(NormBackwardParams) == 8);
static_assert(sizeof(PartialSumParams) == 32 && alignof(PartialSumParams) == 8);

namespace {

constexpr const auto& kVecBytes = kRowVecBytes;
constexpr const auto& kThreadsPerRow = kRowThreadsPerRow;

// Registers beyond the row data and the sums: addresses, indices, the item and row loops,
// the reductions and one step's fp32 math.
constexpr int kRegisterOverhead = 48;
constexpr int kMaxRegistersPerThread = 255;

// A thread holds two streams (x, dy) and fp32 sums where the forward holds one row, so the
// heuristic aims at half the forward's share of a row.
constexpr std::int64_t kTargetElementsPerThread = 16;
constexpr int kTargetRowsPerCta = 4;
constexpr int kMinHeuristicCta = 128;
constexpr int kMaxHeuristicCtaForShortRows = 256;

bool has(const Problem& problem, std::uint32_t bit) {
  return (problem.flags & bit) != 0;
}

std::string flag_names(std::uint32_t flags) {
  return describe_flags(flags, {{kNormWeight, "weight (1)"},
                                {kNormBias, "bias (2)"},
                                {kNormLayer, "layer (4)"},
                                {kNormTable, "table (16)"},
                                {kNormScalePerToken, "scale per token (32)"},
                                {kNormShiftPerToken, "shift per token (64)"},
                                {kNormSkipWeightGrad, "no weight gradient (128)"},
                                {kNormSkipBiasGrad, "no bias gradient (256)"},
                                {kNormSkipScaleGrad, "no scale gradient (512)"},
                                {kNormSkipShiftGrad, "no shift gradient (1024)"},
                                {kNormTableScaleGrad, "table scale gradient (2048)"},
                                {kNormTableShiftGrad, "table shift gradient (4096)"},
                                {kNormSumPartials, "partial sums (8192)"}});
}

std::int64_t vec_elements(const Problem& problem, const Config& config) {
  return std::max<std::int64_t>(
      1, config.vec_bytes / static_cast<std::int64_t>(dtype_size(problem.dtype)));
}

std::int64_t item_cap(std::int64_t hidden) {
  const auto fit =
      static_cast<std::int64_t>(std::bit_floor(static_cast<std::uint64_t>(std::max<std::int64_t>(
          1, NormBackwardFamily::kPartialElements / std::max<std::int64_t>(hidden, 1)))));
  return std::clamp(fit, NormBackwardFamily::kMinItems, NormBackwardFamily::kMaxItems);
}

// The next row's streams are loaded while the current one is worked (kiln::norm_backward's
// PREFETCH); absent means 0.
constexpr const char* kPrefetchExtra = "prefetch";
bool prefetch_of(const Config& config) {
  return config.extra_or(kPrefetchExtra, 0) != 0;
}

// The parameter sums in shared memory (kiln::norm_backward's SHARED_SUMS); absent means 0.
constexpr const char* kSharedSumsExtra = "shared_sums";
bool shared_sums_of(const Config& config) {
  return config.extra_or(kSharedSumsExtra, 0) != 0;
}

// How many fp32 parameter sums the kernel keeps per element of the row.
int parameter_sums(unsigned features) {
  int sums = 0;
  for (unsigned bit : {NormBackwardFeature::weight_sum, NormBackwardFeature::dy_sum,
                       NormBackwardFeature::scale_sum}) {
    if ((features & bit) != 0) {
      ++sums;
    }
  }
  return sums;
}

std::int64_t pow2_ceil(std::int64_t value) {
  return static_cast<std::int64_t>(
      std::bit_ceil(static_cast<std::uint64_t>(std::max<std::int64_t>(value, 1))));
}

}  // namespace

NormBackwardFamily::NormBackwardFamily(Op op) : op_(op) {
  if (op != Op::rms_norm_backward && op != Op::fused_add_rms_norm_backward &&
      op != Op::layer_norm_backward && op != Op::adaln_backward) {
    throw Error("kiln: NormBackwardFamily does not implement op " + std::string(op_name(op)));
  }
}

std::uint32_t NormBackwardFamily::allowed_flags() const {
  switch (op_) {
    case Op::rms_norm_backward:
    case Op::fused_add_rms_norm_backward:
      return kNormWeight | kNormSkipWeightGrad | kNormSumPartials;
    case Op::layer_norm_backward:
      return kNormWeight | kNormBias | kNormSkipWeightGrad | kNormSkipBiasGrad | kNormSumPartials;
    case Op::adaln_backward:
      return kNormWeight | kNormLayer | kNormTable | kNormScalePerToken | kNormShiftPerToken |
             kNormSkipWeightGrad | kNormSkipScaleGrad | kNormSkipShiftGrad | kNormTableScaleGrad |
             kNormTableShiftGrad | kNormSumPartials;
    default:
      return 0;
  }
}

bool NormBackwardFamily::sums_partials(const Problem& problem) {
  return has(problem, kNormSumPartials);
}

unsigned NormBackwardFamily::features(const Problem& problem) const {
  unsigned f = 0;
  if (has(problem, kNormWeight)) {
    f |= NormBackwardFeature::weight;
    if (!has(problem, kNormSkipWeightGrad)) {
      f |= NormBackwardFeature::weight_sum;
    }
  }
  switch (op_) {
    case Op::fused_add_rms_norm_backward:
      f |= NormBackwardFeature::residual;
      break;
    case Op::layer_norm_backward:
      f |= NormBackwardFeature::layer;
      if (has(problem, kNormBias) && !has(problem, kNormSkipBiasGrad)) {
        f |= NormBackwardFeature::dy_sum;
      }
      break;
    case Op::adaln_backward: {
      f |= NormBackwardFeature::modulate;
      if (has(problem, kNormLayer)) {
        f |= NormBackwardFeature::layer;
      }
      if (has(problem, kNormTable)) {
        f |= NormBackwardFeature::table;
      }
      // A per-token operand's gradient is per token (dscale written per row, dshift is dy
      // itself); a per-sample one's is a sum per sample. A table row's is a sum either way.
      const bool scale_grad = !has(problem, kNormSkipScaleGrad);
      const bool scale_per_token = has(problem, kNormScalePerToken);
      if (scale_grad && scale_per_token) {
        f |= NormBackwardFeature::scale_rows;
      }
      if ((scale_grad && !scale_per_token) || has(problem, kNormTableScaleGrad)) {
        f |= NormBackwardFeature::scale_sum;
      }
      const bool shift_grad = !has(problem, kNormSkipShiftGrad);
      if ((shift_grad && !has(problem, kNormShiftPerToken)) || has(problem, kNormTableShiftGrad)) {
        f |= NormBackwardFeature::dy_sum;
      }
      break;
    }
    default:
      break;
  }
  return f;
}

bool NormBackwardFamily::sums_per_sample(std::uint32_t flags) {
  const bool scale = (flags & (kNormScalePerToken | kNormSkipScaleGrad)) == 0;
  const bool shift = (flags & (kNormShiftPerToken | kNormSkipShiftGrad)) == 0;
  return scale || shift;
}

bool NormBackwardFamily::has_partials(const Problem& problem) const {
  return (features(problem) & (NormBackwardFeature::weight_sum | NormBackwardFeature::dy_sum |
                               NormBackwardFeature::scale_sum)) != 0;
}

bool NormBackwardFamily::item_kernel(const Problem& problem, const Config& config) const {
  return has_partials(problem) || prefetch_of(config);
}

std::int64_t NormBackwardFamily::slots(std::int64_t hidden, std::int64_t segment_rows,
                                       std::int64_t segments) {
  const std::int64_t per_segment = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(std::bit_floor(static_cast<std::uint64_t>(
             std::max<std::int64_t>(1, item_cap(hidden) / std::max<std::int64_t>(segments, 1))))));
  return std::min(pow2_ceil(segment_rows), per_segment);
}

std::int64_t NormBackwardFamily::groups(std::int64_t hidden, std::int64_t rows) {
  return std::min(pow2_ceil(rows), item_cap(hidden));
}

namespace {

std::optional<ArgumentError> problem_error(const NormBackwardFamily& family,
                                           const Problem& problem) {
  if (auto error = norm_problem_error(family, problem, family.allowed_flags(), flag_names)) {
    return error;
  }
  if (has(problem, kNormSumPartials) && problem.flags != kNormSumPartials) {
    return ArgumentError(std::string(family.name()), "flags",
                         "partial sums (8192) alone: the sums' problem has no other bit",
                         flag_names(problem.flags));
  }
  return std::nullopt;
}

// ---- the partial sums' kernel (kiln::sum_partials) ----------------------------------------

constexpr std::array<int, 3> kSumVecBytes = {16, 8, 4};  // fp32 vectors, widest first
constexpr std::array<int, 3> kSumColumnThreads = {16, 32, 64};
constexpr std::array<int, 3> kSumCtaThreads = {256, 512, 1024};

std::string sum_invalid_reason(const Problem& problem, const Config& config,
                               const DeviceTraits& device) {
  if (!config.extra.empty()) {
    return "the partial sums have no tunable named '" + config.extra.begin()->first + "'";
  }
  if (!one_of(kSumVecBytes, config.vec_bytes)) {
    return "vec_bytes " + std::to_string(config.vec_bytes) + " is not 16, 8 or 4 (fp32 vectors)";
  }
  if (problem.hidden % (config.vec_bytes / 4) != 0) {
    return "a row of " + std::to_string(problem.hidden) + " is not whole " +
           std::to_string(config.vec_bytes) + "-byte vectors of fp32";
  }
  if (!one_of(kSumColumnThreads, config.threads_per_row)) {
    return "threads_per_row " + std::to_string(config.threads_per_row) + " is not 16, 32 or 64";
  }
  if (!one_of(kSumCtaThreads, config.cta_threads) ||
      config.cta_threads > device.max_threads_per_block ||
      config.cta_threads < 4 * config.threads_per_row) {
    return "cta_threads " + std::to_string(config.cta_threads) +
           " is not 256, 512 or 1024 with at least 4 row lanes of threads_per_row";
  }
  return {};
}

std::vector<Config> sum_space(const Problem& problem, const DeviceTraits& device) {
  std::vector<Config> configs;
  for (int vec : kSumVecBytes) {
    for (int columns : kSumColumnThreads) {
      for (int cta : kSumCtaThreads) {
        Config config;
        config.vec_bytes = vec;
        config.threads_per_row = columns;
        config.cta_threads = cta;
        if (sum_invalid_reason(problem, config, device).empty()) {
          configs.push_back(config);
        }
      }
    }
  }
  return configs;
}

// The widest vector, 32 columns and 32 row lanes: on an H200 the fastest of 8, 16 and 32
// lanes at 256 and 512 partial rows 2048-14848 wide, 1.9-3.2x faster than torch's sum and
// cast (bench/diagnostics/partial_sums.py).
Config sum_heuristic(const Problem& problem, const DeviceTraits& device) {
  const std::vector<Config> configs = sum_space(problem, device);
  if (configs.empty()) {
    throw Error("kiln: no valid launch config for " + problem.key());
  }
  const int vec = configs.front().vec_bytes;
  for (const Config& config : configs) {
    if (config.vec_bytes == vec && config.threads_per_row == 32 && config.cta_threads == 1024) {
      return config;
    }
  }
  return configs.front();
}

}  // namespace

void NormBackwardFamily::check(const Problem& problem) const {
  if (auto error = problem_error(*this, problem)) {
    throw *error;
  }
}

std::int64_t NormBackwardFamily::elements_per_thread(const Problem& problem, const Config& config) {
  const std::int64_t vec = vec_elements(problem, config);
  const std::int64_t per_step = vec * std::max(1, config.threads_per_row);
  return ceil_div(problem.hidden, per_step) * vec;
}

// The row streams held as raw vectors between the loads and dx (x, dy, and dr or the scale
// operand where present; kiln::norm_backward_rows also holds the weight and table rows),
// plus one fp32 register per held element and parameter sum.
std::int64_t NormBackwardFamily::registers_per_thread(const Problem& problem,
                                                      const Config& config) const {
  const unsigned f = features(problem);
  const std::int64_t elements = elements_per_thread(problem, config);
  const std::int64_t steps = elements / vec_elements(problem, config);
  const std::int64_t words = std::max(1, config.vec_bytes / 4);
  int streams = 2;
  if ((f & NormBackwardFeature::residual) != 0) {
    ++streams;
  }
  if ((f & NormBackwardFeature::modulate) != 0) {
    ++streams;
  }
  if (!item_kernel(problem, config)) {
    streams += ((f & NormBackwardFeature::weight) != 0 ? 1 : 0) +
               ((f & NormBackwardFeature::table) != 0 ? 1 : 0);
  }
  const int sums = shared_sums_of(config) ? 0 : parameter_sums(f);
  const std::int64_t held = steps * words * streams * (prefetch_of(config) ? 2 : 1);
  return held + elements * sums + kRegisterOverhead;
}

std::int64_t NormBackwardFamily::shared_sums_bytes(const Problem& problem,
                                                   const Config& config) const {
  if (!shared_sums_of(config)) {
    return 0;
  }
  return std::int64_t{parameter_sums(features(problem))} * elements_per_thread(problem, config) *
         config.cta_threads * static_cast<std::int64_t>(sizeof(float));
}

std::string NormBackwardFamily::invalid_reason(const Problem& problem, const Config& config,
                                               const DeviceTraits& device) const {
  if (auto error = problem_error(*this, problem)) {
    return error->message();
  }
  if (sums_partials(problem)) {
    return sum_invalid_reason(problem, config, device);
  }
  for (const auto& [extra, value] : config.extra) {
    if (extra != kPrefetchExtra && extra != kSharedSumsExtra) {
      return std::string(name()) + " has no tunable named '" + extra + "'";
    }
    if (value != 0 && value != 1) {
      return extra + " " + std::to_string(value) + " is neither 0 nor 1";
    }
  }
  if (shared_sums_of(config)) {
    if (!has_partials(problem)) {
      return "shared_sums holds the parameter sums, and this problem sums none";
    }
    // The row reductions' static shared memory (a float4 a warp at most) counts too.
    const std::int64_t smem =
        shared_sums_bytes(problem, config) + std::int64_t{config.cta_threads} / 32 * 16;
    if (smem > device.smem_per_block_optin) {
      return "shared_sums needs " + std::to_string(smem) +
             " bytes of shared memory per CTA, more than the device's " +
             std::to_string(device.smem_per_block_optin);
    }
  }

  const std::int64_t held = elements_per_thread(problem, config);
  if (std::string why = row_split_reason(problem, config, device, held, kMaxElementsPerThread);
      !why.empty()) {
    return why;
  }
  const int cta = config.cta_threads;
  // The widest split stays valid (it may spill), so every hidden size has a config.
  const int register_cap =
      std::min(kMaxRegistersPerThread, std::max(1, device.regs_per_block / cta));
  const std::int64_t registers = registers_per_thread(problem, config);
  // A prefetching config holds a second row; it is only offered where both fit.
  const bool widest = is_widest_split(config, device) && !prefetch_of(config);
  if (registers > register_cap && !widest) {
    return "holding " + std::to_string(held) + " elements of two rows and their sums needs about " +
           std::to_string(registers) + " registers per thread, more than the " +
           std::to_string(register_cap) + " a " + std::to_string(cta) + "-thread CTA allows";
  }
  return {};
}

std::vector<Config> NormBackwardFamily::space(const Problem& problem,
                                              const DeviceTraits& device) const {
  check(problem);
  if (sums_partials(problem)) {
    return sum_space(problem, device);
  }
  std::vector<Config> configs;
  for (int vec : kVecBytes) {
    for (int tpr : row_split_options(problem, vec)) {
      for (int cta : row_cta_options(tpr)) {
        for (bool prefetch : {false, true}) {
          Config config;
          config.vec_bytes = vec;
          config.threads_per_row = tpr;
          config.cta_threads = cta;
          if (prefetch) {
            config.extra[kPrefetchExtra] = 1;
          }
          if (invalid_reason(problem, config, device).empty()) {
            configs.push_back(std::move(config));
            continue;
          }
          // Past kMaxHiddenForRegisterSums, a config whose registers cannot hold the sums is
          // offered with them in shared memory. One whose registers can keeps them there:
          // rms_norm 14848 wide (one sum) lost 5-9% when the fast tune also weighed those.
          if (problem.hidden > kMaxHiddenForRegisterSums && has_partials(problem)) {
            config.extra[kSharedSumsExtra] = 1;
            if (invalid_reason(problem, config, device).empty()) {
              configs.push_back(std::move(config));
            }
          }
        }
      }
    }
  }
  return configs;
}

// As the forward norms' heuristic, aiming at kTargetElementsPerThread: the widest vector,
// then the split and CTA nearest to the target share of a row and kTargetRowsPerCta rows.
Config NormBackwardFamily::heuristic(const Problem& problem, const DeviceTraits& device) const {
  if (sums_partials(problem)) {
    check(problem);
    return sum_heuristic(problem, device);
  }
  const std::vector<Config> configs = space(problem, device);
  if (configs.empty()) {
    throw Error("kiln." + std::string(name()) + ": no valid launch config for " + problem.key() +
                " on sm_" + std::to_string(device.sm));
  }
  const int vec = configs.front().vec_bytes;
  Config target;
  target.vec_bytes = vec;
  target.threads_per_row = kThreadsPerRow.back();
  for (int tpr : kThreadsPerRow) {
    target.threads_per_row = tpr;
    if (elements_per_thread(problem, target) <= kTargetElementsPerThread) {
      break;
    }
  }
  target.cta_threads = std::max(
      {kMinHeuristicCta, target.threads_per_row,
       std::min(kTargetRowsPerCta * target.threads_per_row, kMaxHeuristicCtaForShortRows)});

  const int target_tpr_log = log2_ceil(target.threads_per_row);
  const int target_cta_log = log2_ceil(target.cta_threads);
  auto distance = [&](const Config& c) {
    const int tpr_log = log2_ceil(c.threads_per_row);
    return std::array<int, 3>{std::abs(tpr_log - target_tpr_log), -tpr_log,
                              std::abs(log2_ceil(c.cta_threads) - target_cta_log)};
  };
  const Config* best = nullptr;
  for (const Config& config : configs) {
    if (config.vec_bytes != vec) {
      continue;
    }
    if (best == nullptr || distance(config) < distance(*best)) {
      best = &config;
    }
  }
  return best != nullptr ? *best : configs.front();
}

std::string NormBackwardFamily::name_expression(const Problem& problem,
                                                const Config& config) const {
  if (sums_partials(problem)) {
    return "kiln::sum_partials<" + std::string(dtype_cuda_type(problem.dtype)) + ", " +
           std::to_string(problem.hidden) + ", " + std::to_string(config.vec_bytes) + ", " +
           std::to_string(config.threads_per_row) + ", " + std::to_string(config.cta_threads) + ">";
  }
  const std::string kernel = item_kernel(problem, config) ? "norm_backward" : "norm_backward_rows";
  std::string variant;  // the defaulted PREFETCH and SHARED_SUMS, spelt out only when set
  if (shared_sums_of(config)) {
    variant = prefetch_of(config) ? ", true, true" : ", false, true";
  } else if (prefetch_of(config)) {
    variant = ", true";
  }
  return "kiln::" + kernel + "<" + std::string(dtype_cuda_type(problem.dtype)) + ", " +
         std::to_string(problem.hidden) + ", " + std::to_string(config.vec_bytes) + ", " +
         std::to_string(config.threads_per_row) + ", " + std::to_string(config.cta_threads) + ", " +
         std::to_string(features(problem)) + "u" + variant + ">";
}

// One group per item up to groups(), the kernel's item loop covering the rest; one group per
// row for kiln::norm_backward_rows. The reduction's shared memory is static; shared_sums's is
// dynamic.
LaunchGeometry NormBackwardFamily::geometry(const Problem& problem, const Config& config,
                                            std::int64_t rows) const {
  LaunchGeometry geometry;
  if (sums_partials(problem)) {
    // A band of threads_per_row vectors a CTA; the kernel walks the segments and rows.
    const std::int64_t vectors = problem.hidden / std::max(1, config.vec_bytes / 4);
    geometry.grid[0] = covering_grid(vectors, config.threads_per_row);
    geometry.block[0] = static_cast<std::uint32_t>(config.cta_threads);
    return geometry;
  }
  const std::int64_t covered = item_kernel(problem, config) ? groups(problem.hidden, rows) : rows;
  geometry.grid[0] = covering_grid(covered, config.rows_per_cta());
  geometry.block[0] = static_cast<std::uint32_t>(config.cta_threads);
  geometry.smem_bytes = static_cast<std::uint32_t>(shared_sums_bytes(problem, config));
  return geometry;
}

namespace {

std::vector<BufferSpec> backward_buffers(const NormBackwardFamily& family, const Problem& problem,
                                         std::int64_t rows) {
  if (NormBackwardFamily::sums_partials(problem)) {
    // One segment of `rows` partial rows (at least one), each element of out their sum.
    const std::int64_t items = std::max<std::int64_t>(rows, 1);
    return {{"partial", DType::f32, items * problem.hidden, false},
            {"out", problem.dtype, problem.hidden, true, items}};
  }
  const unsigned f = family.features(problem);
  const DType t = problem.dtype;
  const std::int64_t d = problem.hidden;
  const std::int64_t items = NormBackwardFamily::slots(d, rows, 1);
  std::vector<BufferSpec> specs;
  specs.push_back({"dy", t, rows * d, false});
  specs.push_back({"x", t, rows * d, false});
  if ((f & NormBackwardFeature::residual) != 0) {
    specs.push_back({"dr", t, rows * d, false});
  }
  if ((f & NormBackwardFeature::modulate) != 0) {
    const std::int64_t scale_rows = has(problem, kNormScalePerToken) ? rows : 1;
    specs.push_back({"scale", t, scale_rows * d, false});
  }
  if ((f & NormBackwardFeature::table) != 0) {
    specs.push_back({"table_scale", t, d, false});
  }
  if ((f & NormBackwardFeature::weight) != 0) {
    specs.push_back({"weight", t, d, false});
  }
  specs.push_back({"dx", t, rows * d, true});
  if ((f & NormBackwardFeature::scale_rows) != 0) {
    specs.push_back({"dscale", t, rows * d, true});
  }
  if ((f & NormBackwardFeature::weight_sum) != 0) {
    specs.push_back({"weight_partial", DType::f32, items * d, true});
  }
  if ((f & NormBackwardFeature::dy_sum) != 0) {
    specs.push_back({"dy_partial", DType::f32, items * d, true});
  }
  if ((f & NormBackwardFeature::scale_sum) != 0) {
    specs.push_back({"scale_partial", DType::f32, items * d, true});
  }
  return specs;
}

}  // namespace

std::vector<BufferSpec> NormBackwardFamily::buffers(const Problem& problem,
                                                    std::int64_t rows) const {
  check(problem);
  if (rows < 0) {
    throw ArgumentError(std::string(name()), "rows", "a count >= 0", std::to_string(rows));
  }
  return backward_buffers(*this, problem, rows);
}

std::vector<std::byte> NormBackwardFamily::pack_params(
    const Problem& problem, std::int64_t rows, std::span<const std::uint64_t> addresses) const {
  const std::vector<BufferSpec> specs = backward_buffers(*this, problem, rows);
  if (addresses.size() != specs.size()) {
    std::string names;
    for (const BufferSpec& spec : specs) {
      names += (names.empty() ? "" : ", ") + spec.name;
    }
    throw Error("kiln." + std::string(name()) + ": pack_params: expected " +
                std::to_string(specs.size()) + " addresses (" + names + "), got " +
                std::to_string(addresses.size()));
  }
  if (sums_partials(problem)) {
    PartialSumParams sums{};
    sums.partial = reinterpret_cast<const float*>(static_cast<std::uintptr_t>(addresses[0]));
    sums.out = reinterpret_cast<void*>(static_cast<std::uintptr_t>(addresses[1]));
    sums.items = std::max<std::int64_t>(rows, 1);
    sums.segments = 1;
    std::vector<std::byte> bytes(sizeof(sums));
    std::memcpy(bytes.data(), &sums, sizeof(sums));
    return bytes;
  }
  NormBackwardParams params;
  std::memset(&params, 0, sizeof(params));
  for (std::size_t i = 0; i < specs.size(); ++i) {
    void* address = reinterpret_cast<void*>(static_cast<std::uintptr_t>(addresses[i]));
    const std::string& n = specs[i].name;
    if (n == "dy") {
      params.dy = address;
    }
    if (n == "x") {
      params.x = address;
    }
    if (n == "dr") {
      params.dr = address;
    }
    if (n == "scale") {
      params.scale = address;
    }
    if (n == "table_scale") {
      params.table_scale = address;
    }
    if (n == "weight") {
      params.weight = address;
    }
    if (n == "dx") {
      params.dx = address;
    }
    if (n == "dscale") {
      params.dscale = address;
    }
    if (n == "weight_partial") {
      params.weight_partial = static_cast<float*>(address);
    }
    if (n == "dy_partial") {
      params.dy_partial = static_cast<float*>(address);
    }
    if (n == "scale_partial") {
      params.scale_partial = static_cast<float*>(address);
    }
  }
  const std::int64_t d = problem.hidden;
  const bool per_token = has(problem, kNormScalePerToken);
  params.scale_batch_stride = per_token ? rows * d : d;
  params.scale_token_stride = per_token ? d : 0;
  params.rows = rows;
  params.tokens = std::max<std::int64_t>(rows, 1);
  params.segments = 1;
  params.segment_rows = rows;
  params.slots = slots(d, rows, 1);
  params.dy_row_stride = d;
  params.dr_row_stride = d;
  params.x_row_stride = d;
  params.eps = NormFamily::kDefaultEps;
  std::vector<std::byte> bytes(sizeof(params));
  std::memcpy(bytes.data(), &params, sizeof(params));
  return bytes;
}

std::int64_t NormBackwardFamily::bytes_moved(const Problem& problem, std::int64_t rows) const {
  std::int64_t bytes = 0;
  for (const BufferSpec& spec : backward_buffers(*this, problem, rows)) {
    bytes += spec.elements * static_cast<std::int64_t>(dtype_size(spec.dtype));
  }
  return bytes;
}

std::vector<Problem> NormBackwardFamily::common_problems(DType dtype, std::int64_t hidden,
                                                         const PrewarmModel& model) const {
  const std::uint32_t align = row_alignment({row_bytes(dtype, hidden)});
  auto make = [&](std::uint32_t flags) { return Problem{op_, dtype, hidden, flags, align}; };
  // Full training (its gradients' partial sums added up by the sums' kernel, which the host
  // always calls at 16), and LoRA's (the norm's parameters and the modulation frozen: dx only).
  const Problem sums{op_, dtype, hidden, kNormSumPartials, 16};
  std::vector<Problem> problems;
  switch (op_) {
    case Op::rms_norm_backward:
      problems = {make(kNormWeight), sums, make(kNormWeight | kNormSkipWeightGrad), make(0)};
      break;
    case Op::fused_add_rms_norm_backward:
      problems = {make(kNormWeight), sums, make(kNormWeight | kNormSkipWeightGrad)};
      break;
    case Op::layer_norm_backward:
      problems = {make(kNormWeight | kNormBias), sums,
                  make(kNormWeight | kNormBias | kNormSkipWeightGrad | kNormSkipBiasGrad), make(0)};
      break;
    case Op::adaln_backward: {
      // FLUX (LayerNorm, per sample); LTX-Video (RMS, per token, from table rows).
      constexpr std::uint32_t kFrozen = kNormSkipScaleGrad | kNormSkipShiftGrad;
      constexpr std::uint32_t kLtx = kNormTable | kNormScalePerToken | kNormShiftPerToken;
      problems = {make(kNormLayer), sums, make(kNormLayer | kFrozen),
                  make(kLtx | kNormTableScaleGrad | kNormTableShiftGrad), make(kLtx | kFrozen)};
      // A modulated norm with a weight in the kernel (CogVideoX's affine LayerNorms) trains
      // that weight too.
      for (std::uint32_t flags : model.modulation_flags.value_or(std::vector<std::uint32_t>{})) {
        if ((flags & kNormWeight) != 0 && (flags & kNormTable) == 0) {
          problems.push_back(make(flags));
        }
      }
      break;
    }
    default:
      break;
  }
  return problems;
}

}  // namespace kiln
