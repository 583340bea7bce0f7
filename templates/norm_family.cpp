#include "templates/norm_family.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <type_traits>

#include "cache/error.h"
#include "templates/config_rules.h"
#include "templates/kiln/norm_params.cuh"
#include "templates/norm_rules.h"

namespace kiln {

static_assert(alignof(NormParams) == 8);

namespace {

constexpr const auto& kVecBytes = kRowVecBytes;
constexpr const auto& kThreadsPerRow = kRowThreadsPerRow;

// Registers beyond the row data: addresses, indices, the reductions, one step's fp32 math
// and its per-column operands (as calibrated on ptxas -v of sm_75 and sm_90 builds).
constexpr int kRegisterOverhead = 40;
constexpr int kMaxRegistersPerThread = 255;

constexpr std::int64_t kTargetElementsPerThread = 32;
constexpr int kTargetRowsPerCta = 4;
constexpr int kMinHeuristicCta = 128;
// The same replay: the full tunes' best configs of 2688-32768 rows mostly hold one row per
// 128-thread CTA where this was 256 (two rows of 128 threads or four of 64).
constexpr int kMaxHeuristicCtaForShortRows = 128;
// A halved split holding up to this many elements a thread is taken where it idles fewer
// lanes (busy_lane_share) by kBetterBalance: replayed against 77 full tunes of the norm
// family on an H200 (`kiln tune replay`), rms_norm 32768x4544 went from 9% behind the best
// config to the best.
constexpr std::int64_t kMaxBalancedElementsPerThread = 48;
constexpr double kBetterBalance = 0.1;
// One row per SM or fewer: measured on an H200 at 1 row (gated_adaln 2432-3072 wide, adaln
// 4544-5120), the fastest configs hold 8-16 elements a thread (5.6 us at 512 threads a row
// against 9.4 us at 64).
constexpr std::int64_t kLatencyElementsPerThread = 16;
// gated_adaln loads five operands for each element (x, y, and the gate, scale and shift rows)
// and writes two: at 1 and 128 rows its best configs on an H200 hold 8 elements a thread
// (2048, 4096 and 5120 wide; bench/results/tuning-2026-11-30-NVIDIA_H200-rows-*), and 16
// took 1.13-1.34x their time.
constexpr std::int64_t kGatedLatencyElementsPerThread = 8;

// The extras that keep a row elsewhere than in registers (NormFamily::row_forms).
constexpr const char* kRereadExtra = "reread";
constexpr const char* kStageExtra = "stage";

// The row is read twice rather than held (kiln::norm's REREAD); absent means 0.
std::int64_t reread_of(const Config& config) {
  return config.extra_or(kRereadExtra, 0);
}
constexpr std::int64_t kRereadMinRowBytes = 4096;

// The row is staged in shared memory rather than held in registers (kiln::norm_staged);
// absent means 0.
std::int64_t stage_of(const Config& config) {
  return config.extra_or(kStageExtra, 0);
}
// cp.async, which stages a row without holding registers, came with sm_80; it copies 4, 8
// or 16 bytes.
constexpr int kStageMinSm = 80;
constexpr int kStageMinVecBytes = 4;
// Measured on an H200 at 32768 rows (bf16, full tunes): staging won from 16 KB of row
// streams (rms_norm 8192, gated_adaln 4096 with its five streams).
constexpr std::int64_t kStageMinBytesPerRow = std::int64_t{16} * 1024;
// Shared memory the driver reserves per resident CTA (sm_80 and later).
constexpr std::int64_t kReservedSmemPerCta = 1024;

// The row is split over this many CTAs of a thread-block cluster (kiln::norm_cluster);
// absent means 1 (one CTA per row).
std::int64_t cluster_of(const Config& config) {
  return config.extra_or("cluster", 1);
}
constexpr std::array<int, 3> kClusterCtas = {2, 4, 8};  // 8: the portable cluster size
constexpr int kClusterMinSm = 90;
// What one SM must stream for a row (x, and the residual, y, gate, scale and shift rows
// where read) before a cluster pays. Measured on an H200 (bf16, one row, full tunes, then
// side by side): a cluster cut rms_norm 8192 wide from 5.09 to 4.93 us, 14848 wide from
// 5.92 to 5.41, and gated_adaln 14848 wide from 8.86 to 6.14; rms_norm 4096 wide (8 KB) was
// no faster (4.96 vs 4.86).
constexpr std::int64_t kClusterMinRowBytes = std::int64_t{16} * 1024;
// From this many bytes of streams a row, a pair of CTAs sharing each row is worth measuring
// at any row count. H200 full tunes (2026-11-24): per-token gated_adaln 8192 wide (five 16 KB
// rows) ran fastest as v16.t256.c256.cluster=2 at 4096, 8192 and 32768 rows, 1.9%, 1.3% and
// 0.6% ahead of the best config of one CTA a row, and the fast search, which measured no
// cluster there, chose one 1.3-3.7% behind; side by side with torch.compile the bench went
// from 0.99x to 1.03x at 2688 rows (83.8 -> 79.8 us). Rows of 45-60 KB (gated_adaln 4544
// and 5120 wide, fused_add_rms_norm 14848 wide) ran fastest with one CTA a row, and so did
// adaln and gated_adaln 14848 wide (89 and 148 KB), where the pair is measured and loses.
constexpr std::int64_t kClusterPairRowBytes = std::int64_t{64} * 1024;

bool has(const Problem& problem, std::uint32_t bit) {
  return (problem.flags & bit) != 0;
}

std::string flag_names(std::uint32_t flags) {
  return describe_flags(flags, {{kNormWeight, "weight (1)"},
                                {kNormBias, "bias (2)"},
                                {kNormLayer, "layer (4)"},
                                {kNormInPlace, "in-place (8)"},
                                {kNormTable, "table (16)"},
                                {kNormPerToken, "per-token (32)"},
                                {kNormRowLoop, "row loop (64)"},
                                {kNormTableF32, "fp32 table (128)"},
                                {kNormGateSigmoid, "sigmoid gate (256)"},
                                {kNormGateFirst, "gate first (512)"}});
}

// The share of a row split's lane-steps that hold a vector of the row: 1 when the row's
// vectors split evenly over its threads, less where the last step leaves lanes idle.
double busy_lane_share(const Problem& problem, const Config& config) {
  const std::int64_t elements = NormFamily::elements_per_thread(problem, config);
  const std::int64_t lanes = std::max(1, config.threads_per_row);
  return static_cast<double>(problem.hidden) / static_cast<double>(elements * lanes);
}

}  // namespace

NormFamily::NormFamily(Op op) : op_(op) {
  if (op != Op::rms_norm && op != Op::fused_add_rms_norm && op != Op::layer_norm &&
      op != Op::adaln && op != Op::gated_adaln && op != Op::rms_norm_gated) {
    throw Error("kiln: NormFamily does not implement op " + std::string(op_name(op)));
  }
}

std::uint32_t NormFamily::allowed_flags() const {
  switch (op_) {
    case Op::rms_norm:
      return kNormWeight | kNormRowLoop;
    case Op::fused_add_rms_norm:
      return kNormWeight | kNormInPlace | kNormRowLoop;
    case Op::layer_norm:
      return kNormWeight | kNormBias | kNormRowLoop;
    case Op::adaln:
      return kNormWeight | kNormLayer | kNormTable | kNormTableF32 | kNormPerToken | kNormRowLoop;
    case Op::gated_adaln:
      return kNormWeight | kNormLayer | kNormTable | kNormTableF32 | kNormPerToken | kNormInPlace |
             kNormRowLoop;
    case Op::rms_norm_gated:
      return kNormWeight | kNormGateSigmoid | kNormGateFirst | kNormRowLoop;
    default:
      return 0;
  }
}

bool NormFamily::needs_row_loop(std::int64_t rows) {
  return rows > kMaxGridCtas;
}

// A family is asked only about problems of its own op (norm_rules checks it).
unsigned NormFamily::features(const Problem& problem) const {
  return norm_features(problem);
}

unsigned norm_features(const Problem& problem) {
  unsigned f = 0;
  if (has(problem, kNormWeight)) {
    f |= NormFeature::weight;
  }
  if (has(problem, kNormBias)) {
    f |= NormFeature::bias;
  }
  if (has(problem, kNormInPlace)) {
    f |= NormFeature::in_place;
  }
  if (has(problem, kNormRowLoop)) {
    f |= NormFeature::row_loop;
  }
  switch (problem.op) {
    case Op::fused_add_rms_norm:
      f |= NormFeature::residual;
      break;
    case Op::layer_norm:
      f |= NormFeature::layer;
      break;
    case Op::rms_norm_gated:
      f |= NormFeature::z_gate;
      if (has(problem, kNormGateSigmoid)) {
        f |= NormFeature::z_sigmoid;
      }
      if (has(problem, kNormGateFirst)) {
        f |= NormFeature::z_first;
      }
      break;
    case Op::gated_adaln:
      f |= NormFeature::gate;
      [[fallthrough]];
    case Op::adaln:
      f |= NormFeature::modulate;
      if (has(problem, kNormLayer)) {
        f |= NormFeature::layer;
      }
      if (has(problem, kNormTable)) {
        f |= NormFeature::table;
        // fp32 rows beside fp32 x are x's dtype: the same kernel as without the flag.
        if (has(problem, kNormTableF32) && problem.dtype != DType::f32) {
          f |= NormFeature::table_f32;
        }
      }
      if (!has(problem, kNormPerToken)) {
        f |= NormFeature::per_sample;
      }
      break;
    default:
      break;
  }
  return f;
}

namespace {

// The pieces of `params` that Layout holds, copied into it.
template <typename Layout>
NormArgBytes pack_layout(const NormParams& params) {
  Layout args{};
  static_cast<NormCoreParams&>(args) = params;
  if constexpr (std::is_base_of_v<NormSumParams, Layout>) {
    static_cast<NormSumParams&>(args) = params;
  }
  if constexpr (std::is_base_of_v<NormModulationParams, Layout>) {
    static_cast<NormModulationParams&>(args) = params;
  }
  if constexpr (std::is_base_of_v<NormGateParams, Layout>) {
    static_cast<NormGateParams&>(args) = params;
  }
  NormArgBytes packed;
  std::memcpy(packed.bytes.data(), &args, sizeof(args));
  packed.size = sizeof(args);
  return packed;
}

}  // namespace

NormArgBytes pack_norm_args(unsigned features, const NormParams& params) {
  const bool gate = (features & NormFeature::gate) != 0;
  const bool modulate = (features & NormFeature::modulate) != 0;
  const bool sum = (features & NormFeature::second_row) != 0;
  if (gate) {
    return pack_layout<NormGatedArgs>(params);
  }
  if (modulate) {
    return pack_layout<NormModulatedArgs>(params);
  }
  return sum ? pack_layout<NormSumArgs>(params) : pack_layout<NormPlainArgs>(params);
}

namespace {

std::optional<ArgumentError> problem_error(const NormFamily& family, const Problem& problem) {
  if (has(problem, kNormTableF32) && !has(problem, kNormTable)) {
    return ArgumentError(std::string(family.name()), "flags",
                         "fp32 table (128) only with table (16)", flag_names(problem.flags));
  }
  return norm_problem_error(family, problem, family.allowed_flags(), flag_names);
}

// Vectors a thread keeps live per step: the row itself (as T), per-token modulation
// operands (scale, shift) from their load to the output, and with a persistent grid every
// stream of the next row. Per-column operands and per-sample modulation rows are loaded
// where they are used (a few registers for one step at a time, counted in the overhead).
int live_vectors_per_step(const NormFamily& family, const Problem& problem, bool prefetch) {
  const unsigned f = family.features(problem);
  const bool streamed_modulation = (f & NormFeature::per_sample) == 0;
  int live = 1;
  if ((f & NormFeature::modulate) != 0 && streamed_modulation) {
    live += 2;
  }
  if ((f & NormFeature::z_gate) != 0) {
    ++live;
  }
  if (prefetch) {
    live += static_cast<int>(family.row_streams(problem));
  }
  return live;
}

}  // namespace

std::int64_t NormFamily::elements_per_thread(const Problem& problem, const Config& config) {
  const std::int64_t vec_elems = std::max<std::int64_t>(
      1, config.vec_bytes / static_cast<std::int64_t>(dtype_size(problem.dtype)));
  const std::int64_t per_step = vec_elems * std::max(1, config.threads_per_row) *
                                std::max<std::int64_t>(1, cluster_of(config));
  return ceil_div(problem.hidden, per_step) * vec_elems;
}

void NormFamily::check(const Problem& problem) const {
  if (auto error = problem_error(*this, problem)) {
    throw *error;
  }
}

std::int64_t NormFamily::row_streams(const Problem& problem) const {
  const unsigned f = features(problem);
  const bool streamed = (f & NormFeature::per_sample) == 0;
  std::int64_t streams = 1;
  if ((f & NormFeature::second_row) != 0) {
    ++streams;
  }
  if ((f & NormFeature::gate) != 0 && streamed) {
    ++streams;
  }
  if ((f & NormFeature::modulate) != 0 && streamed) {
    streams += 2;
  }
  return streams;
}

std::int64_t NormFamily::row_stream_bytes(const Problem& problem) const {
  return row_streams(problem) * problem.hidden *
         static_cast<std::int64_t>(dtype_size(problem.dtype));
}

std::int64_t NormFamily::staged_smem_bytes(const Problem& problem, const Config& config) const {
  if (stage_of(config) == 0) {
    return 0;
  }
  const std::int64_t vec_elems = std::max<std::int64_t>(
      1, config.vec_bytes / static_cast<std::int64_t>(dtype_size(problem.dtype)));
  const std::int64_t steps = elements_per_thread(problem, config) / vec_elems;
  return row_streams(problem) * steps * config.cta_threads * config.vec_bytes;
}

std::int64_t NormFamily::registers_per_thread(const Problem& problem, const Config& config) const {
  const std::int64_t elements = elements_per_thread(problem, config);
  const std::int64_t vec_elems = std::max<std::int64_t>(
      1, config.vec_bytes / static_cast<std::int64_t>(dtype_size(problem.dtype)));
  std::int64_t steps = elements / vec_elems;
  const std::int64_t words = std::max(1, config.vec_bytes / 4);
  if (stage_of(config) != 0) {
    steps = 1;  // a staged row is read one step at a time
  }
  if (reread_of(config) != 0) {
    // A re-read row's passes (kiln::NormRow::process_reread): a fused sum is read one step
    // at a time; otherwise x is read in one go, then once more with the per-token scale and
    // shift one step at a time, or with nothing else in one go.
    const unsigned f = features(problem);
    if ((f & (NormFeature::residual | NormFeature::gate)) != 0) {
      steps = 1;
    } else {
      steps = std::max<std::int64_t>(steps, live_vectors_per_step(*this, problem, false));
      return steps * words + kRegisterOverhead;
    }
  }
  return steps * words * live_vectors_per_step(*this, problem, persistent_grid_of(config) > 0) +
         kRegisterOverhead;
}

int NormFamily::resident_ctas(const Problem& problem, const Config& config,
                              const DeviceTraits& device) const {
  std::int64_t resident =
      kiln::resident_ctas(registers_per_thread(problem, config), config.cta_threads, device);
  if (const std::int64_t smem = staged_smem_bytes(problem, config); smem > 0) {
    resident = std::max<std::int64_t>(
        1, std::min(resident, device.smem_per_sm / (smem + kReservedSmemPerCta)));
  }
  return static_cast<int>(resident);
}

std::string NormFamily::invalid_reason(const Problem& problem, const Config& config,
                                       const DeviceTraits& device) const {
  if (auto error = problem_error(*this, problem)) {
    return error->message();
  }
  for (const auto& [name, value] : config.extra) {
    if (name != "grid" && name != kRereadExtra && name != kStageExtra && name != "cluster") {
      return std::string(this->name()) + " has no tunable named '" + name + "'";
    }
  }
  if ((features(problem) & NormFeature::z_gate) != 0 &&
      (reread_of(config) != 0 || stage_of(config) != 0)) {
    return "a gated output's row is held with its gate: it is neither re-read nor staged";
  }
  if (const std::int64_t reread = reread_of(config); reread != 0) {
    if (reread != 1) {
      return "reread " + std::to_string(reread) + " is neither 0 nor 1";
    }
    // Measured on an H200: re-reading pays where holding the row means holding a second
    // stream with it: the fused ops' two input rows, per-token scale and shift rows (adaln
    // 32768 x 8192: 510 us re-read, 515 staged, 524 held); and for a plain row, read in one
    // go and kept in L1 for its second pass, with fewer registers than held, so more rows
    // per SM (rms_norm 32768 x 8192: 252.7 us re-read, 260.4 staged, 264.0 held).
    if (persistent_grid_of(config) != 0) {
      return "a re-read row is not prefetched by a persistent grid";
    }
    if (problem.hidden * static_cast<std::int64_t>(dtype_size(problem.dtype)) <
        kRereadMinRowBytes) {
      return "rows under 4 KB are held: a re-read saves too few registers to pay";
    }
    const std::int64_t vec_elems = std::max<std::int64_t>(
        1, config.vec_bytes / static_cast<std::int64_t>(dtype_size(problem.dtype)));
    if (elements_per_thread(problem, config) / vec_elems < 2) {
      return "a thread's share of the row is one vector: re-reading it saves no registers";
    }
    // LayerNorm's shifted sums read the row's first element, which an in-place thread may
    // already have overwritten.
    if ((features(problem) & NormFeature::layer) != 0 && has(problem, kNormInPlace)) {
      return "an in-place LayerNorm row is not re-read";
    }
  }
  if (std::string why = stage_reason(problem, config, device); !why.empty()) {
    return why;
  }
  if (std::string why = cluster_reason(problem, config, device); !why.empty()) {
    return why;
  }

  const std::int64_t held = elements_per_thread(problem, config);
  if (std::string why = row_split_reason(problem, config, device, held, kMaxElementsPerThread);
      !why.empty()) {
    return why;
  }
  const int cta = config.cta_threads;
  const int register_cap =
      std::min(kMaxRegistersPerThread, std::max(1, device.regs_per_block / cta));
  const std::int64_t registers = registers_per_thread(problem, config);
  const bool widest = is_widest_split(config, device);
  if (registers > register_cap && !(widest && persistent_grid_of(config) == 0)) {
    return "holding " + std::to_string(held) + " elements and their operands needs about " +
           std::to_string(registers) + " registers per thread, more than the " +
           std::to_string(register_cap) + " a " + std::to_string(cta) + "-thread CTA allows";
  }

  if (auto reason = persistent_grid_reason(persistent_grid_of(config),
                                           resident_ctas(problem, config, device), device);
      !reason.empty()) {
    return reason;
  }
  return {};
}

std::string NormFamily::stage_reason(const Problem& problem, const Config& config,
                                     const DeviceTraits& device) const {
  const std::int64_t stage = stage_of(config);
  if (stage == 0) {
    return {};
  }
  if (stage != 1) {
    return "stage " + std::to_string(stage) + " is neither 0 nor 1";
  }
  if (device.sm < kStageMinSm) {
    return "a staged row needs cp.async (sm_80 or later), not sm_" + std::to_string(device.sm);
  }
  if (config.vec_bytes < kStageMinVecBytes) {
    return "a staged row is copied in 4-, 8- or 16-byte vectors (cp.async), not " +
           std::to_string(config.vec_bytes);
  }
  if (persistent_grid_of(config) != 0 || reread_of(config) != 0) {
    return "a staged row is neither prefetched by a persistent grid nor re-read";
  }
  if (row_stream_bytes(problem) < kStageMinBytesPerRow) {
    return "a row whose streams are under 16 KB is held: it takes few registers, so staging "
           "frees too few to pay";
  }
  const std::int64_t vec_elems = std::max<std::int64_t>(
      1, config.vec_bytes / static_cast<std::int64_t>(dtype_size(problem.dtype)));
  if (elements_per_thread(problem, config) / vec_elems < 2) {
    return "a thread's share of the row is one vector: staging it frees no registers";
  }
  // The reduction's static shared memory counts against the same limit: a float per warp,
  // or LayerNorm's sums and shift (kiln::NormRow::shifted_moments, a float4).
  const std::int64_t per_warp = (features(problem) & NormFeature::layer) != 0 ? 16 : 4;
  const std::int64_t smem =
      staged_smem_bytes(problem, config) + std::int64_t{config.cta_threads} / 32 * per_warp;
  if (smem > device.smem_per_block_optin) {
    return "staging needs " + std::to_string(smem) + " bytes of shared memory per CTA, more than " +
           "the device's " + std::to_string(device.smem_per_block_optin);
  }
  return {};
}

std::string NormFamily::cluster_reason(const Problem& problem, const Config& config,
                                       const DeviceTraits& device) const {
  const std::int64_t ctas = cluster_of(config);
  if (ctas == 1 && config.extra.count("cluster") == 0) {
    return {};
  }
  if (!one_of(kClusterCtas, ctas)) {
    return "cluster " + std::to_string(ctas) + " is not " + list_of(kClusterCtas);
  }
  if (device.sm < kClusterMinSm) {
    return "a cluster of CTAs needs sm_90 or later, not sm_" + std::to_string(device.sm);
  }
  if (config.threads_per_row != config.cta_threads) {
    return "a clustered CTA holds a slice of one row: threads_per_row (" +
           std::to_string(config.threads_per_row) + ") must equal cta_threads (" +
           std::to_string(config.cta_threads) + ")";
  }
  if (config.cta_threads % 32 != 0) {
    return "a clustered CTA is whole warps, not " + std::to_string(config.cta_threads) + " threads";
  }
  if (persistent_grid_of(config) != 0 || reread_of(config) != 0 || stage_of(config) != 0) {
    return "a clustered row is neither prefetched by a persistent grid, re-read nor staged";
  }
  if (row_stream_bytes(problem) < kClusterMinRowBytes) {
    return "a row whose streams are under 16 KB is read by one CTA: a cluster's barriers cost "
           "about what its extra SMs save";
  }
  const std::int64_t vectors = problem.hidden *
                               static_cast<std::int64_t>(dtype_size(problem.dtype)) /
                               std::max(1, config.vec_bytes);
  if (std::int64_t{config.threads_per_row} * ctas > vectors) {
    return "a cluster of " + std::to_string(ctas) + " CTAs of " +
           std::to_string(config.cta_threads) + " threads leaves threads idle: a row has only " +
           std::to_string(vectors) + " vectors of " + std::to_string(config.vec_bytes) + " bytes";
  }
  return {};
}

std::vector<Config> NormFamily::space(const Problem& problem, const DeviceTraits& device) const {
  check(problem);
  std::vector<Config> configs;
  for (int vec : kVecBytes) {
    for (int tpr : row_split_options(problem, vec)) {
      for (int cta : row_cta_options(tpr)) {
        // One pass, holding the row (waves 0) or staging it in shared memory (-2); then
        // persistent grids of the estimated residency and of twice it (the estimate is
        // conservative, and a grid short of what fits leaves SMs half idle); and the row
        // read twice instead of held (-1). The fast search measures a shape's other extras
        // in this order.
        for (int waves : {0, -2, 1, 2, -1}) {
          Config config;
          config.vec_bytes = vec;
          config.threads_per_row = tpr;
          config.cta_threads = cta;
          if (waves == -1) {
            config.extra[kRereadExtra] = 1;
          }
          if (waves == -2) {
            config.extra[kStageExtra] = 1;
          }
          if (waves > 0) {
            size_persistent_grid(config, waves, device, [&](const Config& c) {
              return resident_ctas(problem, c, device);
            });
          }
          if (invalid_reason(problem, config, device).empty()) {
            configs.push_back(std::move(config));
          }
        }
        // A row split over a cluster of CTAs, smallest cluster first.
        for (int ctas : kClusterCtas) {
          Config config;
          config.vec_bytes = vec;
          config.threads_per_row = tpr;
          config.cta_threads = cta;
          config.extra["cluster"] = ctas;
          if (invalid_reason(problem, config, device).empty()) {
            configs.push_back(std::move(config));
          }
        }
      }
    }
  }
  return configs;
}

namespace {

// The one-pass config (widest vector, row held, no extra) nearest to `target`'s split and
// CTA; with `min_cta`, CTAs of fewer threads come last.
Config nearest_one_pass(const std::vector<Config>& configs, const Config& target, int min_cta) {
  const int target_tpr_log = log2_ceil(target.threads_per_row);
  const int target_cta_log = log2_ceil(target.cta_threads);
  auto distance = [&](const Config& c) {
    const int tpr_log = log2_ceil(c.threads_per_row);
    return std::array<int, 4>{c.cta_threads < min_cta ? 1 : 0, std::abs(tpr_log - target_tpr_log),
                              -tpr_log, std::abs(log2_ceil(c.cta_threads) - target_cta_log)};
  };
  const Config* best = nullptr;
  for (const Config& config : configs) {
    if (config.vec_bytes != target.vec_bytes || !config.extra.empty()) {
      continue;
    }
    if (best == nullptr || distance(config) < distance(*best)) {
      best = &config;
    }
  }
  return best == nullptr ? configs.front() : *best;
}

// The fewest threads per row (powers of two) that hold at most `elements` elements each.
Config split_for(const Problem& problem, int vec_bytes, std::int64_t elements) {
  Config target;
  target.vec_bytes = vec_bytes;
  target.threads_per_row = kThreadsPerRow.back();
  for (int tpr : kThreadsPerRow) {
    target.threads_per_row = tpr;
    if (NormFamily::elements_per_thread(problem, target) <= elements) {
      break;
    }
  }
  return target;
}

}  // namespace

std::vector<Config> NormFamily::valid_space(const Problem& problem,
                                            const DeviceTraits& device) const {
  std::vector<Config> configs = space(problem, device);
  if (configs.empty()) {
    throw Error("kiln." + std::string(name()) + ": no valid launch config for " + problem.key() +
                " on sm_" + std::to_string(device.sm));
  }
  return configs;
}

namespace {

// How an op's heuristic forms the held split's row. On 60 full tunes of the five ops on an
// H200 (bf16, 2560-14848 wide, 2688-16384 rows; tests/cpp/tuner/data/
// norm_full_tunes_h200_current.json) the forms below cost rms_norm 1.021, adaln 1.008,
// gated_adaln 1.019, fused_add_rms_norm 1.002 and layer_norm 1.025 times the best on geometric
// mean, the held row 1.056, 1.045, 1.030, 1.021 and 1.046. Timed as op calls after the benches'
// flush, held rows took up to 1.20x the formed ones' time. At 512 threads a row (14848 wide)
// gated_adaln's and fused_add_rms_norm's forms lost 1-2% as calls and tied in the tunes.
// Staging gains layer_norm nothing as a call where measured (8192, 14848 wide) but 1.14x -> 1.04x
// in the tunes at 12288 (BENCHMARKS.md, "The norms' heuristic for more rows than SMs").
struct RowForm {
  const char* extra = nullptr;  // none: the row held
  int split_factor = 1;         // threads a row (and a CTA) over the held split's
  int below_threads = 0;        // the form only where the held split has fewer threads a row
};

RowForm heuristic_row_form(Op op) {
  switch (op) {
    case Op::rms_norm:
    case Op::adaln:
      return {kRereadExtra, 1};
    case Op::gated_adaln:
      return {kRereadExtra, 1, 512};
    case Op::fused_add_rms_norm:
      return {kRereadExtra, 2, 512};
    case Op::layer_norm:
      return {kStageExtra, 1};
    default:
      return {};
  }
}

// `held` in `form`, where the space holds that config for this problem and device (a re-read
// row needs 4 KB and two steps a thread, twice the split at most 1024 threads); else `held`.
Config with_row_form(const std::vector<Config>& configs, const Config& held, RowForm form) {
  if (form.extra == nullptr ||
      (form.below_threads > 0 && held.threads_per_row >= form.below_threads)) {
    return held;
  }
  Config formed = held;
  formed.threads_per_row *= form.split_factor;
  formed.cta_threads *= form.split_factor;
  formed.extra = {{form.extra, 1}};
  const bool valid = std::find(configs.begin(), configs.end(), formed) != configs.end();
  return valid ? formed : held;
}

// The widest vector, then the split and CTA nearest to about kTargetElementsPerThread
// elements per thread and kTargetRowsPerCta rows per CTA; one pass (no persistent grid).
Config held_config(const std::vector<Config>& configs, const Problem& problem) {
  Config target = split_for(problem, configs.front().vec_bytes, kTargetElementsPerThread);
  if (Config half = target; target.threads_per_row > kThreadsPerRow.front()) {
    half.threads_per_row /= 2;
    if (NormFamily::elements_per_thread(problem, half) <= kMaxBalancedElementsPerThread &&
        busy_lane_share(problem, half) >= busy_lane_share(problem, target) + kBetterBalance) {
      target = half;
    }
  }
  target.cta_threads = std::max(
      {kMinHeuristicCta, target.threads_per_row,
       std::min(kTargetRowsPerCta * target.threads_per_row, kMaxHeuristicCtaForShortRows)});
  return nearest_one_pass(configs, target, kMinHeuristicCta);
}

}  // namespace

Config NormFamily::heuristic(const Problem& problem, const DeviceTraits& device) const {
  const std::vector<Config> configs = valid_space(problem, device);
  return with_row_form(configs, held_config(configs, problem), heuristic_row_form(op_));
}

Config NormFamily::held_heuristic(const Problem& problem, const DeviceTraits& device) const {
  return held_config(valid_space(problem, device), problem);
}

// A call of no more rows than SMs is one wave of one row per SM: its time is one row's
// latency, which more threads per row (fewer steps each) shorten.
Config NormFamily::heuristic_for_rows(const Problem& problem, const DeviceTraits& device,
                                      std::int64_t rows) const {
  if (rows < 1 || rows > device.sm_count) {
    return heuristic(problem, device);
  }
  const std::vector<Config> configs = valid_space(problem, device);
  const bool gated = (features(problem) & NormFeature::gate) != 0;
  Config target = split_for(problem, configs.front().vec_bytes,
                            gated ? kGatedLatencyElementsPerThread : kLatencyElementsPerThread);
  target.cta_threads = target.threads_per_row;
  return nearest_one_pass(configs, target, 0);
}

std::string NormFamily::name_expression(const Problem& problem, const Config& config) const {
  if (config.extra.count("cluster") != 0) {
    return "kiln::norm_cluster<" + std::string(dtype_cuda_type(problem.dtype)) + ", " +
           std::to_string(problem.hidden) + ", " + std::to_string(config.vec_bytes) + ", " +
           std::to_string(config.cta_threads) + ", " + std::to_string(cluster_of(config)) + ", " +
           std::to_string(features(problem)) + "u>";
  }
  if (stage_of(config) != 0) {
    return "kiln::norm_staged<" + std::string(dtype_cuda_type(problem.dtype)) + ", " +
           std::to_string(problem.hidden) + ", " + std::to_string(config.vec_bytes) + ", " +
           std::to_string(config.threads_per_row) + ", " + std::to_string(config.cta_threads) +
           ", " + std::to_string(features(problem)) + "u>";
  }
  return "kiln::norm<" + std::string(dtype_cuda_type(problem.dtype)) + ", " +
         std::to_string(problem.hidden) + ", " + std::to_string(config.vec_bytes) + ", " +
         std::to_string(config.threads_per_row) + ", " + std::to_string(config.cta_threads) + ", " +
         std::to_string(features(problem)) + "u, " +
         (persistent_grid_of(config) > 0 ? "true" : "false") + ", " +
         (reread_of(config) != 0 ? "true" : "false") + ">";
}

// The reduction's shared memory is static (sized by the template); a staged row's is
// dynamic.
LaunchGeometry NormFamily::geometry(const Problem& problem, const Config& config,
                                    std::int64_t rows) const {
  LaunchGeometry geometry;
  geometry.smem_bytes = static_cast<std::uint32_t>(staged_smem_bytes(problem, config));
  if (const std::int64_t ctas = cluster_of(config); ctas > 1) {
    // One row per cluster, no grid-stride loop: every row gets its cluster.
    const std::int64_t grid = std::max<std::int64_t>(rows, 1) * ctas;
    if (grid > kMaxGridCtas) {
      throw ArgumentError(std::string(name()), "rows",
                          "at most " + std::to_string(kMaxGridCtas / ctas) +
                              " rows for a cluster of " + std::to_string(ctas) + " CTAs",
                          std::to_string(rows));
    }
    geometry.grid[0] = static_cast<std::uint32_t>(grid);
  } else {
    geometry.grid[0] = capped_grid(covering_grid(rows, config.rows_per_cta()), config);
    // Without a persistent grid or kNormRowLoop the kernel makes one pass: its grid must
    // cover the rows, or the rows past it would be left unwritten.
    const std::int64_t covered = std::int64_t{geometry.grid[0]} * config.rows_per_cta();
    if (persistent_grid_of(config) == 0 && !has(problem, kNormRowLoop) && covered < rows) {
      throw Error("kiln." + std::string(name()) + ": " + std::to_string(rows) + " rows of " +
                  problem.key() + " need the row loop (flag 64): one pass of " +
                  std::to_string(geometry.grid[0]) + " CTAs covers " + std::to_string(covered));
    }
  }
  geometry.block[0] = static_cast<std::uint32_t>(config.cta_threads);
  return geometry;
}

namespace {

// The buffers of a stand-alone run, in pack order. Modulation operands are per token ([rows,
// D]) when the problem says so, else one row broadcast over every token (a single sample).
std::vector<BufferSpec> norm_buffers(const NormFamily& family, const Problem& problem,
                                     std::int64_t rows) {
  const unsigned f = family.features(problem);
  const DType t = problem.dtype;
  const std::int64_t d = problem.hidden;
  const std::int64_t mod_rows = has(problem, kNormPerToken) ? rows : 1;
  std::vector<BufferSpec> specs;
  specs.push_back({"x", t, rows * d, false});
  if ((f & NormFeature::residual) != 0) {
    specs.push_back({"residual", t, rows * d, false});
  }
  if ((f & NormFeature::z_gate) != 0) {
    specs.push_back({"z", t, rows * d, false});
  }
  if ((f & NormFeature::gate) != 0) {
    specs.push_back({"y", t, rows * d, false});
    specs.push_back({"gate", t, mod_rows * d, false});
  }
  if ((f & NormFeature::modulate) != 0) {
    specs.push_back({"scale", t, mod_rows * d, false});
    specs.push_back({"shift", t, mod_rows * d, false});
  }
  if ((f & NormFeature::table) != 0) {
    const DType table = (f & NormFeature::table_f32) != 0 ? DType::f32 : t;
    if ((f & NormFeature::gate) != 0) {
      specs.push_back({"table_gate", table, d, false});
    }
    specs.push_back({"table_scale", table, d, false});
    specs.push_back({"table_shift", table, d, false});
  }
  if ((f & NormFeature::weight) != 0) {
    specs.push_back({"weight", t, d, false});
  }
  if ((f & NormFeature::bias) != 0) {
    specs.push_back({"bias", t, d, false});
  }
  specs.push_back({"out", t, rows * d, true});
  if ((f & (NormFeature::residual | NormFeature::gate)) != 0) {
    specs.push_back({"sum_out", t, rows * d, true});
  }
  return specs;
}

}  // namespace

std::vector<BufferSpec> NormFamily::buffers(const Problem& problem, std::int64_t rows) const {
  check(problem);
  if (rows < 0) {
    throw ArgumentError(std::string(name()), "rows", "a count >= 0", std::to_string(rows));
  }
  return norm_buffers(*this, problem, rows);
}

// A stand-alone run is always out of place (fresh output buffers), also for in-place
// problems: the kernel is the same, with coherent loads.
std::vector<std::byte> NormFamily::pack_params(const Problem& problem, std::int64_t rows,
                                               std::span<const std::uint64_t> addresses) const {
  const std::vector<BufferSpec> specs = norm_buffers(*this, problem, rows);
  if (addresses.size() != specs.size()) {
    std::string names;
    for (const BufferSpec& spec : specs) {
      names += (names.empty() ? "" : ", ") + spec.name;
    }
    throw Error("kiln." + std::string(name()) + ": pack_params: expected " +
                std::to_string(specs.size()) + " addresses (" + names + "), got " +
                std::to_string(addresses.size()));
  }
  NormParams params;
  std::memset(&params, 0, sizeof(params));
  const bool per_token = has(problem, kNormPerToken);
  const std::int64_t d = problem.hidden;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    void* address = reinterpret_cast<void*>(static_cast<std::uintptr_t>(addresses[i]));
    const std::string& n = specs[i].name;
    if (n == "x") {
      params.x = address;
    }
    if (n == "residual" || n == "y" || n == "z") {
      params.second = address;
    }
    if (n == "gate") {
      params.gate.data = address;
    }
    if (n == "scale") {
      params.scale.data = address;
    }
    if (n == "shift") {
      params.shift.data = address;
    }
    if (n == "table_gate") {
      params.gate.table = address;
    }
    if (n == "table_scale") {
      params.scale.table = address;
    }
    if (n == "table_shift") {
      params.shift.table = address;
    }
    if (n == "weight") {
      params.weight = address;
    }
    if (n == "bias") {
      params.bias = address;
    }
    if (n == "out") {
      params.out = address;
    }
    if (n == "sum_out") {
      params.sum_out = address;
    }
  }
  for (NormModulation* m : {&params.scale, &params.shift, &params.gate}) {
    m->batch_stride = per_token ? rows * d : d;
    m->token_stride = per_token ? d : 0;
  }
  params.rows = rows;
  set_tokens(params, std::max<std::int64_t>(rows, 1));
  params.x_row_stride = d;
  params.second_row_stride = d;
  params.out_row_stride = d;
  params.sum_row_stride = d;
  params.eps = kDefaultEps;
  const NormArgBytes packed = pack_norm_args(features(problem), params);
  return {packed.bytes.begin(), packed.bytes.begin() + static_cast<std::ptrdiff_t>(packed.size)};
}

std::int64_t NormFamily::bytes_moved(const Problem& problem, std::int64_t rows) const {
  std::int64_t bytes = 0;
  for (const BufferSpec& spec : norm_buffers(*this, problem, rows)) {
    bytes += spec.elements * static_cast<std::int64_t>(dtype_size(spec.dtype));
  }
  return bytes;
}

std::span<const std::string_view> NormFamily::row_forms() const {
  static constexpr std::array<std::string_view, 2> kRowForms{kRereadExtra, kStageExtra};
  return kRowForms;
}

// Measured on an H200 (bf16, fast tunes, side by side): clusters won at 1 row (rms_norm,
// adaln, gated_adaln 8192 and 14848 wide: 0.2-2.9 us faster) and for adaln and gated_adaln
// at 128 rows of 8192 (7.5 -> 7.2 and 9.9 -> 9.0 us). With a row for every SM, a cluster
// adds no SM to a row, only barriers, and its candidates would take the place of others;
// except a pair of CTAs for a row whose streams are large (kClusterPairRowBytes).
bool NormFamily::worth_measuring(const Problem& problem, const Config& config,
                                 const DeviceTraits& device, std::int64_t rows) const {
  return config.extra.count("cluster") == 0 || rows <= device.sm_count ||
         (cluster_of(config) == 2 && row_stream_bytes(problem) >= kClusterPairRowBytes);
}

std::vector<Problem> NormFamily::common_problems(DType dtype, std::int64_t hidden,
                                                 const PrewarmModel& model) const {
  const std::uint32_t align = row_alignment({row_bytes(dtype, hidden)});
  auto make = [&](std::uint32_t flags) { return Problem{op_, dtype, hidden, flags, align}; };
  switch (op_) {
    case Op::rms_norm:  // diffusers' q/k norms and DiT blocks have no weight
      return {make(kNormWeight), make(0)};
    case Op::fused_add_rms_norm:
      return {make(kNormWeight), make(kNormWeight | kNormInPlace)};
    case Op::layer_norm:
      return {make(kNormWeight | kNormBias), make(0)};
    case Op::adaln:
    case Op::gated_adaln: {
      // FLUX (LayerNorm, per sample); LTX-Video (RMSNorm, a table, per sample for text to
      // video, per token where frames are conditioned).
      std::vector<Problem> problems;
      for (std::uint32_t flags : model.modulation_flags.value_or(
               std::vector<std::uint32_t>{kNormLayer, kNormTable, kNormTable | kNormPerToken})) {
        problems.push_back(make(flags));
      }
      return problems;
    }
    case Op::rms_norm_gated:  // Qwen3-Next, Qwen3.5 (the sigmoid gate compiles on first use)
      return {make(model.gated_norm_flags.value_or(kNormWeight))};
    default:
      return {};
  }
}

}  // namespace kiln
