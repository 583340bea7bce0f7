#include "templates/rope_family.h"
#include "templates/config_rules.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>
#include <optional>

#include "cache/error.h"
#include "templates/kiln/rope_params.cuh"
#include "templates/rope_video.h"

namespace kiln {

static_assert(sizeof(RopeParams) == 416 && alignof(RopeParams) == 8);

namespace {

constexpr std::array<int, 4> kVecBytes = {16, 8, 4, 2};  // widest first: the canonical order
constexpr std::array<int, 9> kThreadsPerRow = {1, 2, 4, 8, 16, 32, 64, 128, 256};
constexpr std::array<int, 4> kCtaThreads = {64, 128, 256, 512};
constexpr std::array<int, 3> kRowsPerThreadValues = {1, 2, 4};
// 32-bit words a thread may hold (its rows' raw vectors plus fp32 cos/sin) before the
// kernel would spill: the row kernels' budget, less room for addresses and indices.
constexpr std::int64_t kMaxHeldWords = 96;
constexpr std::int64_t kMaxRows = (std::int64_t{1} << 31) - 1;
// Registers beyond the held words: addresses, indices, the rows' bookkeeping.
constexpr std::int64_t kRegisterOverhead = 40;

bool interleaved(const Problem& problem) {
  return problem.op == Op::rope_3d || (problem.flags & kRopeInterleaved) != 0;
}

std::optional<ArgumentError> problem_error(Op op, const Problem& problem) {
  const std::string name(op_name(op));
  if (problem.op != op) {
    return ArgumentError(name, "problem", "op " + name, std::string(op_name(problem.op)));
  }
  if (problem.hidden < 2 || problem.hidden > RopeFamily::kMaxHeadDim || problem.hidden % 2 != 0) {
    return ArgumentError(name, "q", "an even head dim in [2, 16384]",
                         std::to_string(problem.hidden));
  }
  if (problem.align < 1 || problem.align > 16 || (problem.align & (problem.align - 1)) != 0) {
    return ArgumentError(name, "q", "alignment a power of two in [1, 16] bytes",
                         std::to_string(problem.align));
  }
  const std::uint32_t allowed =
      op == Op::rope ? (kRopeInterleaved | kRopeTableF32 | kRopeInverse | kRopePositionsInner |
                        kRopeHeadCountFlags | kRopeHalfTable | kRopeHeadNorm | kRopeDeinterleave)
                     : 0u;
  if ((problem.flags & ~allowed) != 0) {
    return ArgumentError(name, "flags",
                         op == Op::rope ? "only interleaved (1), table-fp32 (2), inverse (4), "
                                          "positions-inner (8), heads-even (16), heads-by-4 "
                                          "(32, with 16), one-head-each (64), half-table (128), "
                                          "head-norm (256) and de-interleave (512)"
                                        : "none",
                         std::to_string(problem.flags));
  }
  if ((problem.flags & kRopeHeadsBy4) != 0 && (problem.flags & kRopeHeadsEven) == 0) {
    return ArgumentError(name, "flags", "heads-by-4 (32) together with heads-even (16)",
                         std::to_string(problem.flags));
  }
  if ((problem.flags & kRopeOneHeadEach) != 0 && (problem.flags & kRopeHeadsEven) != 0) {
    return ArgumentError(name, "flags", "one-head-each (64) without heads-even (16)",
                         std::to_string(problem.flags));
  }
  if ((problem.flags & kRopeHeadNorm) != 0 && (problem.flags & kRopeInverse) != 0) {
    return ArgumentError(name, "flags", "head-norm (256) without inverse (4): it has no backward",
                         std::to_string(problem.flags));
  }
  if ((problem.flags & kRopeDeinterleave) != 0 &&
      (problem.flags & (kRopeInterleaved | kRopeHeadNorm)) != 0) {
    return ArgumentError(name, "flags",
                         "de-interleave (512) without interleaved (1) or head-norm (256): it "
                         "de-interleaves the raw row for a half-split rotation",
                         std::to_string(problem.flags));
  }
  if (op == Op::rope_3d && problem.aux != 0) {
    return ArgumentError(name, "rotary_dim", "the whole row (aux 0)", std::to_string(problem.aux));
  }
  if (op == Op::rope_3d && problem.hidden < 6) {
    return ArgumentError(name, "q", "a row of >= 6 elements (dim // 6 frequencies per axis)",
                         std::to_string(problem.hidden));
  }
  if (problem.aux < 0 || problem.aux > problem.hidden || problem.aux % 2 != 0) {
    return ArgumentError(name, "rotary_dim",
                         "an even count in [2, " + std::to_string(problem.hidden) + "] (0: all)",
                         std::to_string(problem.aux));
  }
  return std::nullopt;
}

struct Shape {
  std::int64_t vec = 1;         // elements per vector
  std::int64_t parts = 1;       // vectors per rotation unit
  std::int64_t rot_units = 0;   // rotation units per row
  std::int64_t pass_units = 0;  // vectors of unrotated columns per row
};

Shape shape_of(const Problem& problem, const Config& config) {
  Shape s;
  s.vec = std::max<std::int64_t>(1, config.vec_bytes / std::int64_t(dtype_size(problem.dtype)));
  const std::int64_t rd = RopeFamily::rotary_dim(problem);
  s.parts = interleaved(problem) ? 1 : 2;
  s.rot_units = rd / s.parts / s.vec;
  s.pass_units = (problem.hidden - rd) / s.vec;
  return s;
}

// 32-bit words of a thread's rows' raw vectors in one pass.
std::int64_t row_words(const Problem& problem, const Config& config) {
  const Shape s = shape_of(problem, config);
  const std::int64_t tpr = std::max(1, config.threads_per_row);
  return RopeFamily::rows_per_thread(config) *
         (ceil_div(s.rot_units, tpr) * s.parts + ceil_div(s.pass_units, tpr)) *
         std::max(1, config.vec_bytes / 4);
}

// 32-bit words a thread holds: its rows' raw vectors and fp32 cos/sin of one pass (counted
// for every step, as the validity rule has always counted them).
std::int64_t held_words(const Problem& problem, const Config& config) {
  const Shape s = shape_of(problem, config);
  const std::int64_t rot_steps = ceil_div(s.rot_units, std::max(1, config.threads_per_row));
  return row_words(problem, config) + 2 * rot_steps * s.parts * s.vec;
}

// An estimate of a thread's registers: the held words, the overhead and, prefetching, the
// next rows' raw vectors.
std::int64_t registers_per_thread(const Problem& problem, const Config& config) {
  return held_words(problem, config) + kRegisterOverhead +
         (persistent_grid_of(config) > 0 ? row_words(problem, config) : 0);
}

std::int64_t resident(const Problem& problem, const Config& config, const DeviceTraits& device) {
  return resident_ctas(registers_per_thread(problem, config), config.cta_threads, device);
}

// Whether every call of the problem has one head of q and one of k: rope_3d's always do, a
// table rope's when the host flags it.
bool one_head_each(const Problem& problem) {
  return problem.op == Op::rope_3d || (problem.flags & kRopeOneHeadEach) != 0;
}

// The alignment a model's call of this form has (row_alignment): its heads' rows and its
// table's (MiniMax-M3-VL's [S, 78] bf16 tables: 156-byte rows, 4-byte aligned calls; 36-wide
// bf16 heads: 72-byte rows, 8).
std::uint32_t call_alignment(DType dtype, std::int64_t hidden, std::uint32_t flags,
                             std::int64_t aux) {
  const std::int64_t table_width =
      RopeFamily::table_width(Problem{Op::rope, dtype, hidden, flags, 16, aux});
  return row_alignment({row_bytes(dtype, hidden),
                        row_bytes((flags & kRopeTableF32) != 0 ? DType::f32 : dtype, table_width)});
}

// The kernel's defaulted template arguments (HALF_TABLE, HEAD_NORM, DEINTERLEAVE) up to the
// last that is set, so a kernel without them keeps the name it had before they existed.
std::string defaulted_arguments(const Problem& problem) {
  const bool values[] = {(problem.flags & kRopeHalfTable) != 0,
                         (problem.flags & kRopeHeadNorm) != 0,
                         (problem.flags & kRopeDeinterleave) != 0};
  std::size_t count = std::size(values);
  while (count > 0 && !values[count - 1]) {
    --count;
  }
  std::string text;
  for (std::size_t i = 0; i < count; ++i) {
    text += values[i] ? ", true" : ", false";
  }
  return text;
}

}  // namespace

RopeFamily::RopeFamily(Op op) : op_(op) {}

std::int64_t RopeFamily::rotary_dim(const Problem& problem) {
  return problem.aux == 0 ? problem.hidden : problem.aux;
}

std::int64_t RopeFamily::table_width(const Problem& problem) {
  return (problem.flags & kRopeHalfTable) != 0 ? rotary_dim(problem) / 2 : rotary_dim(problem);
}

int RopeFamily::rows_per_thread(const Config& config) {
  return static_cast<int>(config.extra_or(kRowsPerThread, 1));
}

RopeForm RopeFamily::form(const Problem& problem, const Config& config) {
  switch (rows_per_thread(config)) {
    case 1:
      return kRopeGrouped;
    case 2:
      if ((problem.flags & kRopeHeadsEven) != 0) {
        return kRopeGrouped;
      }
      return one_head_each(problem) ? kRopeTokenPair : kRopeGeneral;
    case 4:
      return (problem.flags & kRopeHeadsBy4) != 0 ? kRopeGrouped : kRopeGeneral;
    default:
      return kRopeGeneral;
  }
}

std::pair<int, int> RopeFamily::standalone_heads(const Problem& problem, std::int64_t rows) {
  // One head each: one token's q and k rows over as many whole tokens as the rows hold.
  if (one_head_each(problem)) {
    return rows >= 2 ? std::pair{1, 1} : std::pair{1, 0};
  }
  // Head counts that keep the flags, as many as models have where the rows hold a token of
  // them: a table row serves every head of its token, so with 4 + 4 heads the run read 6
  // times the table a model's call reads (FLUX's 24 + 24 heads at 4608 tokens: 28 MB of
  // fp32 table instead of 4.7), and the tuner timed that call at 41 us where it took 36.
  // Else the fewest heads that keep the flags, k's when the rows hold a token of both.
  const int group = (problem.flags & kRopeHeadsBy4) != 0    ? 4
                    : (problem.flags & kRopeHeadsEven) != 0 ? 2
                                                            : 0;
  if (group > 0) {
    const std::pair<int, int> typical = group == 4 ? std::pair{24, 8} : std::pair{12, 2};
    if (rows >= typical.first + typical.second) {
      return typical;
    }
    return rows >= std::int64_t{2} * group ? std::pair{group, group} : std::pair{group, 0};
  }
  return rows % 8 == 0 ? std::pair{6, 2} : std::pair{1, 0};
}

void RopeFamily::check(const Problem& problem) const {
  if (auto error = problem_error(op_, problem)) {
    throw *error;
  }
}

std::string RopeFamily::invalid_reason(const Problem& problem, const Config& config,
                                       const DeviceTraits& device) const {
  if (auto error = problem_error(op_, problem)) {
    return error->message();
  }
  for (const auto& [name, value] : config.extra) {
    if (name != kRowsPerThread && name != "grid") {
      return std::string(op_name(op_)) + " has no tunable named '" + name + "'";
    }
  }
  const int rpt = rows_per_thread(config);
  if (!one_of(kRowsPerThreadValues, rpt)) {
    return "rows_per_thread " + std::to_string(rpt) + " is not 1, 2 or 4";
  }
  const auto element = static_cast<int>(dtype_size(problem.dtype));
  const int vec = config.vec_bytes;
  if (!one_of(kVecBytes, vec)) {
    return "vec_bytes " + std::to_string(vec) + " is not 16, 8, 4 or 2";
  }
  if (vec < element) {
    return "vec_bytes " + std::to_string(vec) + " is narrower than one element";
  }
  if (vec > effective_align(problem)) {
    return "vec_bytes " + std::to_string(vec) + " exceeds the data alignment " +
           std::to_string(effective_align(problem));
  }
  const Shape s = shape_of(problem, config);
  const std::int64_t rd = rotary_dim(problem);
  if (interleaved(problem) && s.vec % 2 != 0) {
    return "a vector of " + std::to_string(s.vec) + " element splits an interleaved pair";
  }
  if (rd % (s.parts * s.vec) != 0) {
    return "the rotated " + std::to_string(rd) + " columns are not whole " +
           (s.parts == 2 ? "half-split vector pairs" : "vectors") + " of " + std::to_string(s.vec) +
           " elements";
  }
  if ((problem.hidden - rd) % s.vec != 0) {
    return "the " + std::to_string(problem.hidden - rd) + " unrotated columns are not whole " +
           std::to_string(s.vec) + "-element vectors";
  }
  const int tpr = config.threads_per_row;
  if (!one_of(kThreadsPerRow, tpr)) {
    return "threads_per_row " + std::to_string(tpr) + " is not a power of two in [1, 256]";
  }
  if ((problem.flags & kRopeHeadNorm) != 0 && tpr > 32) {
    return "threads_per_row " + std::to_string(tpr) +
           " spans warps: a normalised head's sum meets by shuffles within one";
  }
  if (tpr > 1 && tpr / 2 >= s.rot_units) {
    return "threads_per_row " + std::to_string(tpr) + " leaves threads idle: a row has " +
           std::to_string(s.rot_units) + " rotation units";
  }
  const int cta = config.cta_threads;
  if (!one_of(kCtaThreads, cta)) {
    return "cta_threads " + std::to_string(cta) + " is not 64..512";
  }
  if (cta < tpr) {
    return "cta_threads is fewer than threads_per_row";
  }
  if (cta > device.max_threads_per_block) {
    return "cta_threads exceeds the device's limit";
  }
  const std::int64_t held = held_words(problem, config);
  if (held > kMaxHeldWords) {
    return "each thread would hold about " + std::to_string(held) +
           " words (rows and cos/sin), more than " + std::to_string(kMaxHeldWords);
  }
  if (persistent_grid_of(config) != 0 && op_ != Op::rope_3d) {
    return "a persistent grid is offered to rope_3d only, whose per-thread angle frequencies it "
           "computes once for many rows";
  }
  if (auto reason = persistent_grid_reason(persistent_grid_of(config),
                                           resident(problem, config, device), device);
      !reason.empty()) {
    return reason;
  }
  return {};
}

std::vector<Config> RopeFamily::space(const Problem& problem, const DeviceTraits& device) const {
  check(problem);
  std::vector<Config> configs;
  for (int vec : kVecBytes) {
    for (int tpr : kThreadsPerRow) {
      for (int cta : kCtaThreads) {
        for (int rpt : kRowsPerThreadValues) {
          // One pass over the rows; rope_3d also persistent grids of the estimated residency
          // and of twice it.
          for (int waves : {0, 1, 2}) {
            if (waves > 0 && op_ != Op::rope_3d) {
              break;
            }
            Config config;
            config.vec_bytes = vec;
            config.threads_per_row = tpr;
            config.cta_threads = cta;
            config.extra[kRowsPerThread] = rpt;
            if (waves > 0) {
              size_persistent_grid(config, waves, device,
                                   [&](const Config& c) { return resident(problem, c, device); });
            }
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

// The widest vector; one rotation unit per thread for a head of up to 16 units (so a head of
// 128 bf16 elements is 8 threads, 16-byte accesses, and one of 80 also 8), one or two for
// longer rows; two rows per thread (a token's heads share cos/sin); 128-thread CTAs, wider
// when a row needs more threads.
Config RopeFamily::heuristic(const Problem& problem, const DeviceTraits& device) const {
  const std::vector<Config> configs = space(problem, device);
  if (configs.empty()) {
    throw Error("kiln." + std::string(op_name(op_)) + ": no valid launch config for " +
                problem.key() + " on sm_" + std::to_string(device.sm));
  }
  const int vec = configs.front().vec_bytes;
  Config probe;
  probe.vec_bytes = vec;
  const std::int64_t units = shape_of(problem, probe).rot_units;
  int target_tpr = 1;
  if (units <= 16) {
    // A head of up to 16 units: one unit a thread, in one step. Where the units are not a
    // power of two, the next power of two of threads leaves some idle, which costs less than a
    // second step for the rest: full tunes on the H200 (bench/diagnostics/rope_full_tunes.py)
    // put heads of 80 (5 units), 72 (9) and 96 (6) 0-4.5% behind their best that way (at 64 to
    // 262144 rows), and 3-25% behind with the power of two below. Longer rows are unmeasured
    // so: the largest power of two of threads at most the units, halved past 64 units.
    while (target_tpr < units) {
      target_tpr *= 2;
    }
  } else {
    while (target_tpr < 256 && std::int64_t{target_tpr} * 2 <= units) {
      target_tpr *= 2;
    }
    if (units > 64) {
      target_tpr = std::max(1, target_tpr / 2);  // long rows: two units each
    }
  }
  const int target_cta = std::max(128, std::min(512, 2 * target_tpr));
  const Config* best = nullptr;
  auto distance = [&](const Config& c) {
    return std::array<std::int64_t, 4>{
        c.vec_bytes == vec ? 0 : 1, std::abs(c.threads_per_row - target_tpr),
        std::abs(rows_per_thread(c) - 2), std::abs(c.cta_threads - target_cta)};
  };
  for (const Config& config : configs) {
    if (best == nullptr || distance(config) < distance(*best)) {
      best = &config;
    }
  }
  return *best;
}

std::string RopeFamily::name_expression(const Problem& problem, const Config& config) const {
  const std::string type(dtype_cuda_type(problem.dtype));
  const bool video = op_ == Op::rope_3d;
  const std::string table = (video || (problem.flags & kRopeTableF32)) ? "float" : type;
  return "kiln::rope<" + type + ", " + table + ", " + std::to_string(problem.hidden) + ", " +
         std::to_string(rotary_dim(problem)) + ", " + std::to_string(config.vec_bytes) + ", " +
         std::to_string(config.threads_per_row) + ", " + std::to_string(config.cta_threads) + ", " +
         std::to_string(rows_per_thread(config)) + ", " +
         (interleaved(problem) ? "true" : "false") + ", " + (video ? "true" : "false") + ", " +
         ((problem.flags & kRopeInverse) != 0 ? "true" : "false") + ", " +
         (persistent_grid_of(config) > 0 ? "true" : "false") + ", " +
         std::to_string(static_cast<int>(form(problem, config))) + defaulted_arguments(problem) +
         ">";
}

LaunchGeometry RopeFamily::geometry(const Problem& problem, const Config& config,
                                    std::int64_t rows) const {
  (void)problem;
  const std::int64_t rows_per_cta =
      std::int64_t{std::max(1, config.cta_threads / std::max(1, config.threads_per_row))} *
      rows_per_thread(config);
  LaunchGeometry geometry;
  geometry.grid[0] = capped_grid(covering_grid(rows, rows_per_cta), config);
  geometry.block[0] = static_cast<std::uint32_t>(config.cta_threads);
  return geometry;
}

std::vector<BufferSpec> RopeFamily::buffers(const Problem& problem, std::int64_t rows) const {
  check(problem);
  const std::string name(op_name(op_));
  if (rows < 0 || rows > kMaxRows) {
    throw ArgumentError(name, "rows", "a count in [0, 2^31)", std::to_string(rows));
  }
  const auto [hq, hk] = standalone_heads(problem, rows);
  const std::int64_t tokens = rows / (hq + hk);
  const std::int64_t d = problem.hidden;
  std::vector<BufferSpec> specs;
  specs.push_back({"q", problem.dtype, tokens * hq * d, false});
  specs.push_back({"k", problem.dtype, std::max<std::int64_t>(1, tokens * hk * d), false});
  if (op_ == Op::rope) {
    const DType table = (problem.flags & kRopeTableF32) ? DType::f32 : problem.dtype;
    specs.push_back({"cos", table, tokens * table_width(problem), false});
    specs.push_back({"sin", table, tokens * table_width(problem), false});
  }
  if ((problem.flags & kRopeHeadNorm) != 0) {
    specs.push_back({"q_weight", problem.dtype, d, false});
    specs.push_back({"k_weight", problem.dtype, d, false});
  }
  specs.push_back({"q_out", problem.dtype, tokens * hq * d, true});
  // With no k heads (odd row counts) k_out is never written: scratch, not an output to check.
  specs.push_back({"k_out", problem.dtype, std::max<std::int64_t>(1, tokens * hk * d), hk > 0});
  return specs;
}

std::vector<std::byte> RopeFamily::pack_params(const Problem& problem, std::int64_t rows,
                                               std::span<const std::uint64_t> addresses) const {
  const bool head_norm = (problem.flags & kRopeHeadNorm) != 0;
  const std::size_t expected = op_ == Op::rope ? (head_norm ? 8 : 6) : 4;
  if (addresses.size() != expected) {
    throw Error("kiln." + std::string(op_name(op_)) + ": pack_params: expected " +
                std::to_string(expected) + " addresses, got " + std::to_string(addresses.size()));
  }
  const auto pointer = [&](std::size_t i) {
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(addresses[i]));
  };
  const auto [hq, hk] = standalone_heads(problem, rows);
  const std::int64_t tokens = rows / (hq + hk);
  const std::int64_t d = problem.hidden;
  RopeParams params;
  std::memset(&params, 0, sizeof(params));
  params.q = pointer(0);
  params.k = pointer(1);
  if (op_ == Op::rope) {
    params.cos = pointer(2);
    params.sin = pointer(3);
  }
  if (head_norm) {
    params.head_norm.q_weight = pointer(4);
    params.head_norm.k_weight = pointer(5);
    params.head_norm.eps = 1e-6f;
  }
  params.q_out = pointer(expected - 2);
  params.k_out = pointer(expected - 1);
  const bool positions_inner = (problem.flags & kRopePositionsInner) != 0;
  set_row_order(params, tokens * (hq + hk), 1, static_cast<int>(hq), static_cast<int>(hk),
                positions_inner, d * static_cast<std::int64_t>(dtype_size(problem.dtype)));
  // Strides of batch, position, head.
  const std::int64_t q_strides[3] = {tokens * hq * d, positions_inner ? d : hq * d,
                                     positions_inner ? tokens * d : d};
  const std::int64_t k_strides[3] = {tokens * hk * d, positions_inner ? d : hk * d,
                                     positions_inner ? tokens * d : d};
  std::copy(q_strides, q_strides + 3, params.q_strides);
  std::copy(q_strides, q_strides + 3, params.q_out_strides);
  std::copy(k_strides, k_strides + 3, params.k_strides);
  std::copy(k_strides, k_strides + 3, params.k_out_strides);
  params.cos_strides[1] = params.sin_strides[1] = table_width(problem);
  if (op_ == Op::rope_3d) {
    VideoRopeSettings settings;
    // Enough positions for every token of the run, so no coordinate repeats.
    settings.frames = static_cast<int>(std::max<std::int64_t>(
        1, ceil_div(tokens, std::int64_t{settings.height} * settings.width)));
    params.video = make_video_grid("rope_3d", d, settings);
  }
  std::vector<std::byte> bytes(sizeof(params));
  std::memcpy(bytes.data(), &params, sizeof(params));
  return bytes;
}

std::int64_t RopeFamily::bytes_moved(const Problem& problem, std::int64_t rows) const {
  const auto element = static_cast<std::int64_t>(dtype_size(problem.dtype));
  std::int64_t bytes = 2 * rows * problem.hidden * element;
  if (op_ == Op::rope) {
    const auto [hq, hk] = standalone_heads(problem, rows);
    const std::int64_t table = (problem.flags & kRopeTableF32) ? 4 : element;
    bytes += 2 * (rows / (hq + hk)) * table_width(problem) * table;
  }
  if ((problem.flags & kRopeHeadNorm) != 0) {
    bytes += 2 * problem.hidden * element;
  }
  return bytes;
}

std::vector<Problem> RopeFamily::common_problems(DType dtype, std::int64_t hidden,
                                                 const PrewarmModel& model) const {
  if (op_ == Op::rope_3d) {
    return {Problem{Op::rope_3d, dtype, hidden, 0u, row_alignment({row_bytes(dtype, hidden)})}};
  }
  // transformers (half-split, table in the model's dtype, or the model's own table form; q and
  // k as its attentions hand them over, [B, S, H, D] memory viewed as [B, H, S, D], and
  // contiguous [B, H, S, D]), diffusers
  // (interleaved, fp32, [B, S, H, D] or, after the head transpose, [B, H, S, D]), with the
  // model's head counts; training also runs each backward, the inverse rotation.
  const std::uint32_t heads = rope_head_flags(model.heads_q, model.heads_k);
  // A model that rotates part of each head calls with that rotary dim (0: the whole head).
  const std::int64_t aux = model.rotary_dim == hidden ? 0 : model.rotary_dim;
  std::vector<std::uint32_t> layouts;
  for (std::uint32_t table : model.rope_tables) {
    layouts.push_back(table);
    layouts.push_back(table | kRopePositionsInner);
  }
  for (std::uint32_t diffusers :
       {kRopeInterleaved | kRopeTableF32, kRopeInterleaved | kRopeTableF32 | kRopePositionsInner}) {
    if (std::find(layouts.begin(), layouts.end(), diffusers) == layouts.end()) {
      layouts.push_back(diffusers);
    }
  }
  std::vector<Problem> problems;
  for (std::uint32_t layout : layouts) {
    const std::uint32_t align = call_alignment(dtype, hidden, layout, aux);
    problems.push_back(Problem{Op::rope, dtype, hidden, layout | heads, align, aux});
    // The attention in kiln's patch normalises each head in the same call (no backward:
    // training takes the norms and the rotation alone).
    if (model.head_norm_layout == layout) {
      problems.push_back(
          Problem{Op::rope, dtype, hidden, layout | heads | kRopeHeadNorm, align, aux});
    }
    if (model.training) {
      problems.push_back(
          Problem{Op::rope, dtype, hidden, layout | heads | kRopeInverse, align, aux});
    }
  }
  return problems;
}

}  // namespace kiln
