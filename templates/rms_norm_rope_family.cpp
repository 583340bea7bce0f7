#include "templates/rms_norm_rope_family.h"
#include "templates/config_rules.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <optional>

#include "cache/error.h"
#include "templates/kiln/rope_params.cuh"
#include "templates/rope_video.h"

namespace kiln {

static_assert(sizeof(RmsNormRopeParams) == 288 && alignof(RmsNormRopeParams) == 8);

namespace {

constexpr std::array<int, 3> kVecBytes = {16, 8, 4};  // a vector holds whole pairs
constexpr std::array<int, 9> kThreadsPerRow = {4, 8, 16, 32, 64, 128, 256, 512, 1024};
constexpr std::array<int, 5> kCtaThreads = {64, 128, 256, 512, 1024};
constexpr int kRegisterOverhead = 40;
constexpr int kMaxRegistersPerThread = 255;
constexpr std::int64_t kTargetElementsPerThread = 32;  // q and k together
// The most the heuristic holds to give every thread of a row the same number of vectors.
constexpr std::int64_t kMaxEvenElementsPerThread = 48;
bool video(const Problem& problem) {
  return (problem.flags & kRmsNormRopeVideo) != 0;
}

// The columns of a token's table row: one angle a column, or one a pair of a head.
std::int64_t table_width(const Problem& problem) {
  return problem.aux == 0 ? problem.hidden : problem.aux / 2;
}

std::optional<ArgumentError> problem_error(const Problem& problem) {
  if (problem.op != Op::rms_norm_rope) {
    return ArgumentError("rms_norm_rope", "problem", "op rms_norm_rope",
                         std::string(op_name(problem.op)));
  }
  if (problem.hidden < 6 || problem.hidden > RmsNormRopeFamily::kMaxWidth ||
      problem.hidden % 2 != 0) {
    return ArgumentError("rms_norm_rope", "q", "an even row width in [6, 32768]",
                         std::to_string(problem.hidden));
  }
  if (problem.align < 1 || problem.align > 16 || (problem.align & (problem.align - 1)) != 0) {
    return ArgumentError("rms_norm_rope", "q", "alignment a power of two in [1, 16] bytes",
                         std::to_string(problem.align));
  }
  if ((problem.flags & ~(kRmsNormRopeVideo | kRmsNormRopeTableF32)) != 0 ||
      ((problem.flags & kRmsNormRopeVideo) && (problem.flags & kRmsNormRopeTableF32))) {
    return ArgumentError("rms_norm_rope", "flags", "video (1) or table-fp32 (2), not both",
                         std::to_string(problem.flags));
  }
  // A head dim in fours: a vector's pairs of q and of the half table's row stay whole.
  if (problem.aux != 0 && (problem.aux < 4 || problem.aux % 4 != 0 ||
                           problem.hidden % problem.aux != 0 || video(problem))) {
    return ArgumentError("rms_norm_rope", "aux",
                         "0 (a table of the whole row, or coordinates) or, with a table, a head "
                         "dim in multiples of 4 dividing the width " +
                             std::to_string(problem.hidden),
                         std::to_string(problem.aux));
  }
  return std::nullopt;
}

std::int64_t elements_per_thread(const Problem& problem, const Config& config) {
  const std::int64_t vec = config.vec_bytes / std::int64_t(dtype_size(problem.dtype));
  return 2 * ceil_div(problem.hidden, vec * config.threads_per_row) * vec;
}

// An estimate of a thread's registers: the held elements counted as floats (as the
// validity rule has always counted them), the overhead, and, prefetching, the next token's
// vectors as loaded.
std::int64_t registers_per_thread(const Problem& problem, const Config& config) {
  const std::int64_t held = elements_per_thread(problem, config);
  const std::int64_t prefetched = persistent_grid_of(config) > 0
                                      ? ceil_div(held * std::int64_t(dtype_size(problem.dtype)), 4)
                                      : 0;
  return held + kRegisterOverhead + prefetched;
}

std::int64_t resident(const Problem& problem, const Config& config, const DeviceTraits& device) {
  return resident_ctas(registers_per_thread(problem, config), config.cta_threads, device);
}

std::int64_t min_ctas_of(const Config& config) {
  return config.extra_or("min_ctas", 0);
}

// The bytes of cos/sin a CTA of the one-pass video kernel parks across its barrier (the
// kernel's kStash), 0 where it does not park them: only where the reduction crosses warps
// and the angles fit in 16 KB.
std::int64_t parked_angle_bytes(const Problem& problem, const Config& config) {
  if (!video(problem) || persistent_grid_of(config) > 0 || config.threads_per_row <= 32) {
    return 0;
  }
  const std::int64_t pairs = elements_per_thread(problem, config) / 4;  // of q's (or k's) half
  const std::int64_t bytes = pairs * config.cta_threads * 8;
  return bytes <= 16384 ? bytes : 0;
}

// The parking kernel, which holds q and k as loaded and its angles in shared memory, takes
// 62 registers a thread at v16.t128.c128 (bf16, 2048 wide), 8 CTAs of 128 threads an SM.
// Asked for 48 (a __launch_bounds__ minimum of 10 CTAs) it spills nothing, and one H200 ran
// [2, 8064, 2048] with coordinates in 1.048x a same-size copy's time instead of 1.070x
// ([2, 2688, 2048]: 1.110x instead of 1.128x); at 40 it spilled and took 1.37x. Other widths,
// dtypes and splits spill a few bytes at 48, so the tuner decides.
constexpr std::int64_t kParkingRegisters = 48;

// The CTAs an SM holds at kParkingRegisters a thread, offered as min_ctas where the parking
// kernel's threads hold more than 16 elements of q and k (fewer need fewer registers than
// that already), where the SM's threads and shared memory allow that many (resident_ctas,
// which counts at most 16: 64-thread CTAs are not offered), and where the
// registers come to exactly kParkingRegisters (sm_75's 1024 threads an SM stop short); else 0.
std::int64_t parking_min_ctas(const Problem& problem, const Config& config,
                              const DeviceTraits& device) {
  const std::int64_t parked = parked_angle_bytes(problem, config);
  if (parked == 0 || elements_per_thread(problem, config) <= 16) {
    return 0;
  }
  const std::int64_t cta = config.cta_threads;
  const std::int64_t count = resident_ctas(kParkingRegisters, config.cta_threads, device);
  constexpr std::int64_t kReductionBytes = 1024;
  if (count * (parked + kReductionBytes) > device.smem_per_sm) {
    return 0;
  }
  const std::int64_t registers = device.regs_per_sm / (count * cta) / 8 * 8;
  return registers == kParkingRegisters ? count : 0;
}

}  // namespace

void RmsNormRopeFamily::check(const Problem& problem) const {
  if (auto error = problem_error(problem)) {
    throw *error;
  }
}

std::string RmsNormRopeFamily::invalid_reason(const Problem& problem, const Config& config,
                                              const DeviceTraits& device) const {
  if (auto error = problem_error(problem)) {
    return error->message();
  }
  for (const auto& [name, value] : config.extra) {
    if (name != "grid" && name != "min_ctas") {
      return "rms_norm_rope has no tunable named '" + name + "'";
    }
  }
  const auto element = static_cast<std::int64_t>(dtype_size(problem.dtype));
  const int vec = config.vec_bytes;
  if (!one_of(kVecBytes, vec)) {
    return "vec_bytes " + std::to_string(vec) + " is not 16, 8 or 4";
  }
  if (vec < 2 * element) {
    return "vec_bytes " + std::to_string(vec) + " cannot hold a whole interleaved pair";
  }
  if (vec > std::max<std::int64_t>(problem.align, element)) {
    return "vec_bytes " + std::to_string(vec) + " exceeds the data alignment " +
           std::to_string(problem.align);
  }
  if ((problem.hidden * element) % vec != 0) {
    return "a row of " + std::to_string(problem.hidden) + " elements is not whole " +
           std::to_string(vec) + "-byte vectors";
  }
  if (problem.aux != 0 && (problem.aux * element) % vec != 0) {
    return "vec_bytes " + std::to_string(vec) + " would straddle two heads of " +
           std::to_string(problem.aux) + " elements";
  }
  const int tpr = config.threads_per_row;
  if (!one_of(kThreadsPerRow, tpr)) {
    return "threads_per_row " + std::to_string(tpr) + " is not a power of two in [4, 1024]";
  }
  const std::int64_t vectors = problem.hidden * element / vec;
  if (tpr != kThreadsPerRow.front() && tpr > vectors) {
    return "threads_per_row " + std::to_string(tpr) + " leaves threads idle";
  }
  const std::int64_t held = elements_per_thread(problem, config);
  if (held > kMaxElementsPerThread) {
    return "each thread would hold " + std::to_string(held) + " elements of q and k, more than " +
           std::to_string(kMaxElementsPerThread);
  }
  const int cta = config.cta_threads;
  if (!one_of(kCtaThreads, cta)) {
    return "cta_threads " + std::to_string(cta) + " is not 64..1024";
  }
  if (cta < tpr) {
    return "cta_threads is fewer than threads_per_row";
  }
  if (cta > device.max_threads_per_block) {
    return "cta_threads exceeds the device's limit";
  }
  const int register_cap =
      std::min(kMaxRegistersPerThread, std::max(1, device.regs_per_block / cta));
  if (registers_per_thread(problem, config) > register_cap) {
    return "holding " + std::to_string(held) + " elements" +
           (persistent_grid_of(config) > 0 ? " and the next token's" : "") +
           " needs more than the " + std::to_string(register_cap) + " registers a " +
           std::to_string(cta) + "-thread CTA allows";
  }
  if (auto reason = persistent_grid_reason(persistent_grid_of(config),
                                           resident(problem, config, device), device);
      !reason.empty()) {
    return reason;
  }
  if (config.extra.contains("min_ctas")) {
    const std::int64_t offered = parking_min_ctas(problem, config, device);
    if (offered == 0) {
      return "min_ctas is offered only to the one-pass kernel with coordinates that parks its "
             "angles, where a thread holds more than 16 elements of q and k and an SM can hold "
             "the CTAs that " +
             std::to_string(kParkingRegisters) + " registers a thread allow";
    }
    if (min_ctas_of(config) != offered) {
      return "min_ctas " + std::to_string(min_ctas_of(config)) + " is not " +
             std::to_string(offered) + ", the CTAs an SM holds at " +
             std::to_string(kParkingRegisters) + " registers a thread";
    }
  }
  return {};
}

std::vector<Config> RmsNormRopeFamily::space(const Problem& problem,
                                             const DeviceTraits& device) const {
  check(problem);
  std::vector<Config> configs;
  for (int vec : kVecBytes) {
    for (int tpr : kThreadsPerRow) {
      for (int cta : kCtaThreads) {
        // One pass over the rows, then persistent grids of the estimated residency and of
        // twice it (the estimate is conservative; a grid short of what fits idles SMs).
        for (int waves : {0, 1, 2}) {
          Config config;
          config.vec_bytes = vec;
          config.threads_per_row = tpr;
          config.cta_threads = cta;
          if (waves > 0) {
            size_persistent_grid(config, waves, device,
                                 [&](const Config& c) { return resident(problem, c, device); });
          }
          if (!invalid_reason(problem, config, device).empty()) {
            continue;
          }
          const std::int64_t count = parking_min_ctas(problem, config, device);
          configs.push_back(config);
          if (count > 0) {
            config.extra["min_ctas"] = count;
            configs.push_back(std::move(config));
          }
        }
      }
    }
  }
  return configs;
}

// The heuristic's threads per row for vectors of `vec` bytes (see heuristic()).
int split_for(const Problem& problem, int vec) {
  const std::int64_t vectors = problem.hidden * std::int64_t(dtype_size(problem.dtype)) / vec;
  Config config;
  config.vec_bytes = vec;
  int best = 0;
  std::int64_t best_idle = 0;   // idle lanes of the last step
  std::int64_t best_lanes = 1;  // lanes over all steps
  std::int64_t best_held = 0;
  for (int tpr : kThreadsPerRow) {  // narrowest first: each thread holds fewer than the last
    if (tpr != kThreadsPerRow.front() && tpr > vectors) {
      break;
    }
    config.threads_per_row = tpr;
    const std::int64_t held = elements_per_thread(problem, config);
    if (held > kMaxEvenElementsPerThread) {
      continue;
    }
    const std::int64_t lanes = ceil_div(vectors, std::int64_t{tpr}) * tpr;
    const std::int64_t idle = lanes - vectors;
    // idle / lanes against best_idle / best_lanes, exactly.
    const bool more_even = idle * best_lanes < best_idle * lanes;
    const bool as_even = idle * best_lanes == best_idle * lanes;
    if (best == 0 || more_even || (as_even && best_held > kTargetElementsPerThread)) {
      best = tpr;
      best_idle = idle;
      best_lanes = lanes;
      best_held = held;
    }
  }
  return best != 0 ? best : kThreadsPerRow.back();
}

// The widest vector, then the split that leaves the fewest of a row's threads idle in its
// last step, among those holding at most kMaxEvenElementsPerThread of q and k together; of
// equally even splits, the narrowest holding at most kTargetElementsPerThread (the row-kernel
// rule RMSNorm uses). A split whose last step runs part-empty idles those lanes for the
// whole token: at Wan 14B's 5120 wide (640 16-byte vectors) 512 threads a row (a second step
// a quarter full) took 475.6 us for 32768 tokens and 256 threads (3 steps, the last half
// full) 396.4; at 1536 (192 vectors) 128 threads (a second step half full) 121.1 us and 64
// (3 vectors each) 114.0 (H200, `bench/tuning.py --ops rms_norm_rope`, BENCHMARKS.md). One
// token per CTA of 128..512 threads (an H200's full tune of [2, 8064, 2048] with
// coordinates, persistent grids: 74.2 us at one token per CTA, 76.7 at two, 80.1 at four;
// one token per CTA was fastest in one pass and with a table too). One pass, registers as
// ptxas chooses: the fast search measures this shape's persistent grids and its min_ctas
// form next (which spills on some shapes, so only a measurement can choose it).
Config RmsNormRopeFamily::heuristic(const Problem& problem, const DeviceTraits& device) const {
  const std::vector<Config> configs = space(problem, device);
  if (configs.empty()) {
    throw Error("kiln.rms_norm_rope: no valid launch config for " + problem.key() + " on sm_" +
                std::to_string(device.sm));
  }
  const int vec = configs.front().vec_bytes;
  Config target;
  target.vec_bytes = vec;
  target.threads_per_row = split_for(problem, vec);
  target.cta_threads = std::clamp(target.threads_per_row, 128, 512);
  const Config* best = nullptr;
  auto distance = [&](const Config& c) {
    return std::array<std::int64_t, 5>{
        c.vec_bytes == vec ? 0 : 1, std::abs(c.threads_per_row - target.threads_per_row),
        std::abs(c.cta_threads - target.cta_threads), persistent_grid_of(c) > 0 ? 1 : 0,
        min_ctas_of(c) > 0 ? 1 : 0};
  };
  for (const Config& config : configs) {
    if (best == nullptr || distance(config) < distance(*best)) {
      best = &config;
    }
  }
  return *best;
}

std::string RmsNormRopeFamily::name_expression(const Problem& problem, const Config& config) const {
  const std::string type(dtype_cuda_type(problem.dtype));
  const std::string table =
      (video(problem) || (problem.flags & kRmsNormRopeTableF32)) ? "float" : type;
  return "kiln::rms_norm_rope<" + type + ", " + table + ", " + std::to_string(problem.hidden) +
         ", " + std::to_string(config.vec_bytes) + ", " + std::to_string(config.threads_per_row) +
         ", " + std::to_string(config.cta_threads) + ", " + (video(problem) ? "true" : "false") +
         ", " + (persistent_grid_of(config) > 0 ? "true" : "false") + ", " +
         std::to_string(min_ctas_of(config)) +
         (problem.aux != 0 ? ", " + std::to_string(problem.aux) : std::string()) + ">";
}

LaunchGeometry RmsNormRopeFamily::geometry(const Problem& problem, const Config& config,
                                           std::int64_t rows) const {
  (void)problem;
  LaunchGeometry geometry;
  geometry.grid[0] = capped_grid(covering_grid(rows, config.rows_per_cta()), config);
  geometry.block[0] = static_cast<std::uint32_t>(config.cta_threads);
  return geometry;
}

std::vector<BufferSpec> RmsNormRopeFamily::buffers(const Problem& problem,
                                                   std::int64_t rows) const {
  check(problem);
  // The kernel finds a token's batch entry and position by 32-bit division.
  if (rows < 0 || rows > std::numeric_limits<std::int32_t>::max()) {
    throw ArgumentError("rms_norm_rope", "rows", "a count in [0, 2^31)", std::to_string(rows));
  }
  const std::int64_t w = problem.hidden;
  std::vector<BufferSpec> specs;
  specs.push_back({"q", problem.dtype, rows * w, false});
  specs.push_back({"k", problem.dtype, rows * w, false});
  specs.push_back({"q_weight", problem.dtype, w, false});
  specs.push_back({"k_weight", problem.dtype, w, false});
  if (!video(problem)) {
    const DType table = (problem.flags & kRmsNormRopeTableF32) ? DType::f32 : problem.dtype;
    specs.push_back({"cos", table, rows * table_width(problem), false});
    specs.push_back({"sin", table, rows * table_width(problem), false});
  }
  specs.push_back({"q_out", problem.dtype, rows * w, true});
  specs.push_back({"k_out", problem.dtype, rows * w, true});
  return specs;
}

std::vector<std::byte> RmsNormRopeFamily::pack_params(
    const Problem& problem, std::int64_t rows, std::span<const std::uint64_t> addresses) const {
  const std::size_t expected = video(problem) ? 6 : 8;
  if (addresses.size() != expected) {
    throw Error("kiln.rms_norm_rope: pack_params: expected " + std::to_string(expected) +
                " addresses, got " + std::to_string(addresses.size()));
  }
  const auto pointer = [&](std::size_t i) {
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(addresses[i]));
  };
  const std::int64_t w = problem.hidden;
  RmsNormRopeParams params;
  std::memset(&params, 0, sizeof(params));
  params.q = pointer(0);
  params.k = pointer(1);
  params.q_weight = pointer(2);
  params.k_weight = pointer(3);
  if (!video(problem)) {
    params.cos = pointer(4);
    params.sin = pointer(5);
  }
  params.q_out = pointer(expected - 2);
  params.k_out = pointer(expected - 1);
  params.rows = rows;
  set_seq_len(params, std::max<std::int64_t>(rows, 1));
  for (long long* strides :
       {params.q_strides, params.k_strides, params.q_out_strides, params.k_out_strides}) {
    strides[0] = rows * w;
    strides[1] = w;
  }
  for (long long* strides : {params.cos_strides, params.sin_strides}) {
    strides[0] = rows * table_width(problem);
    strides[1] = table_width(problem);
  }
  params.eps = kDefaultEps;
  if (video(problem)) {
    VideoRopeSettings settings;
    settings.frames = static_cast<int>(
        std::max<std::int64_t>(1, ceil_div(rows, std::int64_t{settings.height} * settings.width)));
    params.video = make_video_grid("rms_norm_rope", w, settings);
  }
  std::vector<std::byte> bytes(sizeof(params));
  std::memcpy(bytes.data(), &params, sizeof(params));
  return bytes;
}

std::int64_t RmsNormRopeFamily::bytes_moved(const Problem& problem, std::int64_t rows) const {
  const auto element = static_cast<std::int64_t>(dtype_size(problem.dtype));
  std::int64_t bytes = (4 * rows + 2) * problem.hidden * element;
  if (!video(problem)) {
    const std::int64_t table = (problem.flags & kRmsNormRopeTableF32) ? 4 : element;
    bytes += 2 * rows * table_width(problem) * table;
  }
  return bytes;
}

std::vector<Problem> RmsNormRopeFamily::common_problems(DType dtype, std::int64_t hidden,
                                                        const PrewarmModel& model) const {
  const std::int64_t row = row_bytes(dtype, hidden);
  if (model.rms_norm_rope_half_table != 0) {  // Wan: diffusers' fp32 tables, halved
    const std::int64_t half_table = model.rms_norm_rope_half_table / 2;
    return {Problem{Op::rms_norm_rope, dtype, hidden, kRmsNormRopeTableF32,
                    row_alignment({row, half_table * 4}), model.rms_norm_rope_half_table}};
  }
  // LTX-Video: angles from the video grid, or diffusers' fp32 table (rows of the width)
  return {Problem{Op::rms_norm_rope, dtype, hidden, kRmsNormRopeTableF32,
                  row_alignment({row, hidden * 4})},
          Problem{Op::rms_norm_rope, dtype, hidden, kRmsNormRopeVideo, row_alignment({row})}};
}

}  // namespace kiln
