#include "templates/elementwise_family.h"
#include "templates/config_rules.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>

#include "cache/error.h"
#include "templates/kiln/elementwise_params.cuh"

namespace kiln {

// The kernel receives these bytes as its by-value parameter: 4 pointers, 5 long longs, a
// divisor and two floats.
static_assert(sizeof(ElementwiseParams) == 104 && alignof(ElementwiseParams) == 8);

namespace {

constexpr std::array<int, 4> kVecBytes = {16, 8, 4, 2};  // widest first
constexpr std::array<int, 6> kCtaThreads = {32, 64, 128, 256, 512, 1024};
// Below this, a CTA is for calls too small to give every SM a CTA of 128 threads (one or a few
// decode tokens: 1024 16-byte vectors make 8 such CTAs on 132 SMs). Spread over 16-32 SMs,
// more load units issue the same few loads at once, and Inductor spreads such calls the same
// way. Such a CTA takes one vector per thread and a grid covering the data once, the shape
// of a call that fits in one wave.
constexpr int kSmallCta = 128;
constexpr std::array<int, 4> kUnrolls = {1, 2, 4, 8};

// Registers a thread needs beyond the vectors it holds (addresses, indices, loop state, the
// math of one element), estimated from ptxas -v of sm_75 and sm_90 builds.
constexpr int kRegisterOverhead = 32;
constexpr int kMaxRegistersPerThread = 255;

// The heuristic: 16-byte vectors (the widest the data allows), 256 threads (TE's and
// vLLM's elementwise kernels use 256-512), one vector per operand per thread and step, and
// a grid that covers the data once. Measured on an H200 (bf16, fast tune, widths 8192-28672):
// unroll 1 won outright at 1 and 128 tokens (by 6-25% over unroll 2, the kernel being
// latency-bound there) and at 4096 x 8192; from 4096 x 14336 on, every config was within 2%
// of the fastest (the copy-bandwidth ceiling).
constexpr int kHeuristicCta = 256;
constexpr int kHeuristicUnroll = 1;

// Operands the op reads (a, b, c) for the problem.
int operands(const Problem& problem) {
  switch (problem.op) {
    case Op::swiglu:
    case Op::geglu:
    case Op::clamped_swiglu:
      return 2;
    case Op::gelu:
      return (problem.flags & kGeluHasBias) != 0 ? 2 : 1;
    case Op::gated_residual:
      return 3;
    default:
      return 1;
  }
}

std::string flag_names(Op op) {
  switch (op) {
    case Op::swiglu:
      return "flat (1), 64-bit index (32)";
    case Op::geglu:
      return "flat (1), erf (2), 64-bit index (32)";
    case Op::gelu:
      return "flat (1), erf (2), bias (4), 64-bit index (32)";
    case Op::gated_residual:
      return "flat (1), per-sample gate (8), in place (16), 64-bit index (32), shared gate (64)";
    case Op::clamped_swiglu:
      return "flat (1), 64-bit index (32), interleaved (128)";
    default:
      return "none";
  }
}

}  // namespace

ElementwiseFamily::ElementwiseFamily(Op op) : op_(op) {
  if (op != Op::swiglu && op != Op::geglu && op != Op::gelu && op != Op::gated_residual &&
      op != Op::clamped_swiglu) {
    throw Error("kiln: the elementwise family has no op " + std::string(op_name(op)));
  }
}

std::uint32_t ElementwiseFamily::allowed_flags() const {
  switch (op_) {
    case Op::swiglu:
      return kElementwiseFlat | kElementwiseIndex64;
    case Op::geglu:
      return kElementwiseFlat | kGeluErf | kElementwiseIndex64;
    case Op::gelu:
      return kElementwiseFlat | kGeluErf | kGeluHasBias | kElementwiseIndex64;
    case Op::gated_residual:
      return kElementwiseFlat | kGatePerSample | kGatedResidualInPlace | kElementwiseIndex64 |
             kGateShared;
    case Op::clamped_swiglu:
      return kElementwiseFlat | kElementwiseIndex64 | kPackedInterleaved;
    default:
      return 0;
  }
}

bool ElementwiseFamily::needs_index64(std::int64_t elements) {
  // A step of the largest resident grid: 4096 SMs of 2048 threads, 8 vectors each.
  constexpr std::int64_t kLargestStep = std::int64_t{1} << 26;
  return 2 * std::max<std::int64_t>(elements, 0) + kLargestStep > std::int64_t{0xffffffff};
}

void ElementwiseFamily::check_pointwise(const Family& family, const Problem& problem,
                                        std::uint32_t allowed_flags,
                                        const std::string& allowed_names) {
  const std::string op(family.name());
  if (problem.op != family.op()) {
    throw ArgumentError(op, "problem", "op " + op, std::string(op_name(problem.op)));
  }
  if (problem.hidden < 1 || problem.hidden > kMaxHidden) {
    throw ArgumentError(op, "hidden", "a row width in [1, " + std::to_string(kMaxHidden) + "]",
                        std::to_string(problem.hidden));
  }
  if (problem.align < 1 || problem.align > 16 || (problem.align & (problem.align - 1)) != 0) {
    throw ArgumentError(op, "align", "a power of two in [1, 16] bytes",
                        std::to_string(problem.align));
  }
  if ((problem.flags & ~allowed_flags) != 0) {
    throw ArgumentError(op, "flags", "only the bits " + allowed_names,
                        std::to_string(problem.flags));
  }
}

void ElementwiseFamily::check(const Problem& problem) const {
  check_pointwise(*this, problem, allowed_flags(), flag_names(op_));
  const std::string op(name());
  const bool flat = (problem.flags & kElementwiseFlat) != 0;
  if (flat && (problem.flags & (kGeluHasBias | kGatePerSample | kGateShared)) != 0) {
    throw ArgumentError(op, "flags",
                        "no flat layout with a broadcast operand (bias, per-sample or shared gate)",
                        std::to_string(problem.flags));
  }
  if ((problem.flags & kGatePerSample) != 0 && (problem.flags & kGateShared) != 0) {
    throw ArgumentError(op, "flags", "a gate per sample (8) or shared by every row (64), not both",
                        std::to_string(problem.flags));
  }
}

int ElementwiseFamily::widest_vector(const Problem& problem) {
  const auto element = static_cast<std::int64_t>(dtype_size(problem.dtype));
  // An element is always aligned to its own size, whatever smaller alignment was reported.
  const std::int64_t align = std::max<std::int64_t>(problem.align, element);
  const bool flat = (problem.flags & kElementwiseFlat) != 0;
  for (int vec : kVecBytes) {
    if (vec < element || vec > align) {
      continue;
    }
    if (!flat && (problem.hidden * element) % vec != 0) {
      continue;
    }
    return vec;
  }
  return static_cast<int>(element);
}

std::int64_t ElementwiseFamily::vectors(const Problem& problem, int vec_bytes, std::int64_t rows) {
  const std::int64_t per_vector =
      std::max<std::int64_t>(1, vec_bytes / static_cast<std::int64_t>(dtype_size(problem.dtype)));
  rows = std::max<std::int64_t>(rows, 0);
  if ((problem.flags & kElementwiseFlat) != 0) {
    return rows * problem.hidden / per_vector;
  }
  return rows * (problem.hidden / per_vector);
}

std::int64_t ElementwiseFamily::wave_ctas(const DeviceTraits& device, int cta_threads) {
  return std::int64_t{std::max(device.sm_count, 1)} *
         std::max(1, device.max_threads_per_sm / std::max(cta_threads, 1));
}

std::string ElementwiseFamily::invalid_reason(const Problem& problem, const Config& config,
                                              const DeviceTraits& device) const {
  try {
    check(problem);
  } catch (const ArgumentError& error) {
    return error.message();
  }
  for (const auto& [key, value] : config.extra) {
    if (key != "unroll" && key != "max_ctas") {
      return std::string(name()) + " has no tunable named '" + key + "'";
    }
  }
  const int widest = widest_vector(problem);
  if (config.vec_bytes != widest) {
    return "vec_bytes " + std::to_string(config.vec_bytes) + " is not " + std::to_string(widest) +
           ", the widest access the data's alignment and row width allow";
  }
  if (config.threads_per_row != 1) {
    return "threads_per_row " + std::to_string(config.threads_per_row) +
           " is not 1: an elementwise pass splits no row";
  }
  const int cta = config.cta_threads;
  if (!one_of(kCtaThreads, cta)) {
    return "cta_threads " + std::to_string(cta) + " is not 32, 64, 128, 256, 512 or 1024";
  }
  if (cta > device.max_threads_per_block) {
    return "cta_threads " + std::to_string(cta) + " exceeds the device's " +
           std::to_string(device.max_threads_per_block) + " threads per block";
  }
  const std::int64_t unroll = config.extra_or("unroll", 0);
  if (!one_of(kUnrolls, unroll)) {
    return "unroll " + std::to_string(unroll) + " is not 1, 2, 4 or 8";
  }
  const std::int64_t max_ctas = config.extra_or("max_ctas", -1);
  if (cta < kSmallCta && (unroll != 1 || max_ctas != 0)) {
    return "cta_threads " + std::to_string(cta) +
           " (a CTA for calls smaller than the GPU) takes unroll 1 and max_ctas 0";
  }
  if (max_ctas != 0 && max_ctas != wave_ctas(device, cta)) {
    return "max_ctas " + std::to_string(max_ctas) + " is neither 0 (cover the data once) nor " +
           std::to_string(wave_ctas(device, cta)) + " (one resident wave of " +
           std::to_string(cta) + "-thread CTAs)";
  }
  // Every operand's vectors of a step are held at once, plus the output offsets.
  const std::int64_t words = std::max(1, config.vec_bytes / 4);
  const std::int64_t registers =
      operands(problem) * unroll * words + 2 * unroll + kRegisterOverhead;
  const int register_cap =
      std::min(kMaxRegistersPerThread, std::max(1, device.regs_per_block / cta));
  if (registers > register_cap) {
    return "holding " + std::to_string(unroll) + " steps of " + std::to_string(operands(problem)) +
           " operands needs about " + std::to_string(registers) +
           " registers per thread, more than the " + std::to_string(register_cap) + " a " +
           std::to_string(cta) + "-thread CTA allows";
  }
  return {};
}

std::vector<Config> ElementwiseFamily::space(const Problem& problem,
                                             const DeviceTraits& device) const {
  check(problem);
  std::vector<Config> configs;
  for (int cta : kCtaThreads) {
    for (int unroll : kUnrolls) {
      for (std::int64_t max_ctas : {std::int64_t{0}, wave_ctas(device, cta)}) {
        Config config;
        config.vec_bytes = widest_vector(problem);
        config.threads_per_row = 1;
        config.cta_threads = cta;
        config.extra["unroll"] = unroll;
        config.extra["max_ctas"] = max_ctas;
        if (invalid_reason(problem, config, device).empty()) {
          configs.push_back(std::move(config));
        }
      }
    }
  }
  return configs;
}

Config ElementwiseFamily::heuristic(const Problem& problem, const DeviceTraits& device) const {
  check(problem);
  Config config;
  config.vec_bytes = widest_vector(problem);
  config.threads_per_row = 1;
  config.cta_threads = std::min(kHeuristicCta, device.max_threads_per_block);
  config.extra["unroll"] = kHeuristicUnroll;
  config.extra["max_ctas"] = 0;
  if (const std::string why = invalid_reason(problem, config, device); !why.empty()) {
    throw Error("kiln." + std::string(name()) + ": the heuristic config " + config.key() +
                " is invalid for " + problem.key() + ": " + why);
  }
  return config;
}

std::string ElementwiseFamily::name_expression(const Problem& problem, const Config& config) const {
  auto flag = [&](std::uint32_t bit) { return (problem.flags & bit) != 0 ? "true" : "false"; };
  std::string op;
  switch (op_) {
    case Op::swiglu:
      op = "kiln::SiluMul";
      break;
    case Op::geglu:
      op = std::string("kiln::GeluMul<") + flag(kGeluErf) + ">";
      break;
    case Op::gelu:
      op = std::string("kiln::BiasGelu<") + flag(kGeluErf) + ", " + flag(kGeluHasBias) + ">";
      break;
    case Op::clamped_swiglu:
      op = std::string("kiln::ClampedSiluMul<") + flag(kPackedInterleaved) + ">";
      break;
    default:
      op = std::string("kiln::GatedResidual<") + flag(kGatePerSample) + ", " +
           flag(kGatedResidualInPlace) + ">";
      break;
  }
  return "kiln::elementwise<" + std::string(dtype_cuda_type(problem.dtype)) + ", " +
         std::to_string(problem.hidden) + ", " + std::to_string(config.vec_bytes) + ", " +
         std::to_string(config.cta_threads) + ", " +
         std::to_string(config.extra_or("unroll", kHeuristicUnroll)) + ", " +
         flag(kElementwiseFlat) + ", " + flag(kElementwiseIndex64) + ", " + op + ">";
}

LaunchGeometry ElementwiseFamily::geometry(const Problem& problem, const Config& config,
                                           std::int64_t rows) const {
  const std::int64_t per_cta =
      std::int64_t{std::max(config.cta_threads, 1)} *
      std::max<std::int64_t>(config.extra_or("unroll", kHeuristicUnroll), 1);
  LaunchGeometry geometry;
  geometry.grid[0] = covering_grid(vectors(problem, config.vec_bytes, rows), per_cta);
  const std::int64_t max_ctas = config.extra_or("max_ctas", 0);
  if (max_ctas > 0 && geometry.grid[0] > max_ctas) {
    geometry.grid[0] = static_cast<std::uint32_t>(max_ctas);
  }
  geometry.block[0] = static_cast<std::uint32_t>(config.cta_threads);
  // needs_index64 bounds every config's reach; this holds it to the launch itself, so a 32-bit
  // kernel can never wrap its indices silently.
  const std::int64_t reach =
      vectors(problem, config.vec_bytes, rows) + std::int64_t{geometry.grid[0]} * per_cta;
  if ((problem.flags & kElementwiseIndex64) == 0 && reach > std::int64_t{0xffffffff}) {
    throw Error("kiln." + std::string(name()) + ": " + std::to_string(rows) + " rows of " +
                problem.key() + " need the 64-bit index (flag 32): the launch's indices reach " +
                std::to_string(reach));
  }
  return geometry;
}

std::vector<BufferSpec> ElementwiseFamily::buffers(const Problem& problem,
                                                   std::int64_t rows) const {
  check(problem);
  if (rows < 0) {
    throw ArgumentError(std::string(name()), "rows", "a count >= 0", std::to_string(rows));
  }
  const std::int64_t n = rows * problem.hidden;
  const DType t = problem.dtype;
  switch (op_) {
    case Op::swiglu:
    case Op::geglu:
      return {{"gate", t, n, false}, {"up", t, n, false}, {"out", t, n, true}};
    case Op::clamped_swiglu:
      if ((problem.flags & kPackedInterleaved) != 0) {
        return {{"gate_up", t, 2 * n, false}, {"out", t, n, true}};
      }
      return {{"gate", t, n, false}, {"up", t, n, false}, {"out", t, n, true}};
    case Op::gelu:
      if ((problem.flags & kGeluHasBias) != 0) {
        return {{"x", t, n, false}, {"bias", t, problem.hidden, false}, {"out", t, n, true}};
      }
      return {{"x", t, n, false}, {"out", t, n, true}};
    default: {
      // In place or not, a stand-alone run writes a separate output: the kernel is the same
      // (h read coherently), and h stays intact across repetitions and verification.
      std::int64_t gate_rows = rows;
      if ((problem.flags & kGatePerSample) != 0) {
        gate_rows = ceil_div(rows, kStandaloneRowsPerSample);
      } else if ((problem.flags & kGateShared) != 0) {
        gate_rows = 1;
      }
      return {{"h", t, n, false},
              {"y", t, n, false},
              {"gate", t, gate_rows * problem.hidden, false},
              {"out", t, n, true}};
    }
  }
}

std::vector<std::byte> ElementwiseFamily::pack_params(
    const Problem& problem, std::int64_t rows, std::span<const std::uint64_t> addresses) const {
  const bool interleaved = (problem.flags & kPackedInterleaved) != 0;
  const std::size_t expected = interleaved ? 2 : static_cast<std::size_t>(operands(problem)) + 1;
  if (addresses.size() != expected) {
    throw Error("kiln." + std::string(name()) + ": pack_params: expected " +
                std::to_string(expected) + " addresses (the buffers() order), got " +
                std::to_string(addresses.size()));
  }
  auto pointer = [&](std::size_t i) {
    return reinterpret_cast<const void*>(static_cast<std::uintptr_t>(addresses[i]));
  };
  ElementwiseParams params;
  std::memset(&params, 0, sizeof(params));  // deterministic padding and unused fields
  params.a = pointer(0);
  if (expected > 2) {
    params.b = pointer(1);
  }
  params.alpha = kClampedSwigluAlpha;
  params.limit = kClampedSwigluLimit;
  if (expected > 3) {
    params.c = pointer(2);
  }
  params.out = const_cast<void*>(pointer(addresses.size() - 1));
  params.rows = rows;
  params.a_row_stride = interleaved ? 2 * problem.hidden : problem.hidden;
  params.b_row_stride = op_ == Op::gelu ? 0 : problem.hidden;  // gelu's b is the bias
  params.c_row_stride = (problem.flags & kGateShared) != 0 ? 0 : problem.hidden;
  params.out_row_stride = problem.hidden;
  params.rows_per_sample =
      make_divisor((problem.flags & kGatePerSample) != 0 ? kStandaloneRowsPerSample : 1);

  std::vector<std::byte> bytes(sizeof(params));
  std::memcpy(bytes.data(), &params, sizeof(params));
  return bytes;
}

std::int64_t ElementwiseFamily::bytes_moved(const Problem& problem, std::int64_t rows) const {
  std::int64_t elements = 0;
  for (const BufferSpec& spec : buffers(problem, rows)) {
    elements += spec.elements;
  }
  return elements * static_cast<std::int64_t>(dtype_size(problem.dtype));
}

std::vector<Problem> ElementwiseFamily::common_problems(DType dtype, std::int64_t hidden,
                                                        const PrewarmModel& /*model*/) const {
  // Rows back to back (flat) take only the allocations' addresses into the alignment; rows
  // apart take their width too.
  const std::uint32_t rows_apart = row_alignment({row_bytes(dtype, hidden)});
  auto make = [&](std::uint32_t flags) {
    return Problem{op_, dtype, hidden, flags, (flags & kElementwiseFlat) != 0 ? 16u : rows_apart};
  };
  switch (op_) {
    case Op::swiglu:  // two tensors; one packed gate_up tensor
      return {make(kElementwiseFlat), make(0)};
    case Op::geglu:
      return {make(kElementwiseFlat), make(0), make(kElementwiseFlat | kGeluErf), make(kGeluErf)};
    case Op::clamped_swiglu:  // GPT-OSS's experts: one packed row of interleaved pairs per
                              // routed token (flat), or rows apart
      return {make(kPackedInterleaved | kElementwiseFlat), make(kPackedInterleaved)};
    case Op::gelu:  // LTX-Video / FLUX feed-forwards use the tanh form; FLUX's single blocks
                    // write it into a slice of proj_out's input (rows apart: not flat)
      return {make(kElementwiseFlat), make(kGeluHasBias), make(0),
              make(kElementwiseFlat | kGeluErf), make(kGeluHasBias | kGeluErf)};
    default:  // DiT blocks: a gate per sample, or one for a batch of one; a gate per token,
              // flat or (LTX-Video's conditioned frames: views of [B, T, 2, D]) rows apart;
              // in place and not
      return {make(kGatePerSample),
              make(kGatePerSample | kGatedResidualInPlace),
              make(kGateShared),
              make(kGateShared | kGatedResidualInPlace),
              make(kElementwiseFlat),
              make(kElementwiseFlat | kGatedResidualInPlace),
              make(0),
              make(kGatedResidualInPlace)};
  }
}

}  // namespace kiln
