#include "templates/activation_backward_family.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>

#include "cache/error.h"
#include "templates/config_rules.h"
#include "templates/kiln/activation_backward_params.cuh"

namespace kiln {

// The kernels receive these bytes as their by-value parameter: 6 pointers, 6 long longs and
// two floats.
static_assert(sizeof(ActivationBackwardParams) == 104 && alignof(ActivationBackwardParams) == 8);

namespace {

constexpr std::array<int, 4> kPassCtaThreads = {128, 256, 512, 1024};
constexpr std::array<int, 4> kPassUnrolls = {1, 2, 4, 8};
constexpr std::array<int, 4> kReduceCtaThreads = {64, 128, 256, 512};
constexpr std::array<int, 3> kReduceUnrolls = {1, 2, 4};

// As the forward's estimate (templates/elementwise_family.cpp): registers beyond the vectors
// a thread holds.
constexpr int kRegisterOverhead = 32;
constexpr int kMaxRegistersPerThread = 255;

// The elementwise pass: the forward's heuristic (256 threads, one vector per operand per
// step, a grid covering the data once). The reduction: two rows in flight, a CTA as wide as
// a row's vectors up to 256 threads.
constexpr int kPassHeuristicCta = 256;
constexpr int kPassHeuristicUnroll = 1;
constexpr int kReduceHeuristicUnroll = 2;

bool gated(Op op) {
  return op == Op::swiglu_backward || op == Op::geglu_backward || op == Op::clamped_swiglu_backward;
}

bool interleaved(const Problem& problem) {
  return (problem.flags & kPackedInterleaved) != 0;
}

std::int64_t vectors_per_row(const Problem& problem, int vec_bytes) {
  const auto element = static_cast<std::int64_t>(dtype_size(problem.dtype));
  return problem.hidden / std::max<std::int64_t>(1, vec_bytes / element);
}

// The smallest of the reduction's CTA sizes at least as wide as a row's vectors, up to 256.
int reduce_target_cta(const Problem& problem, int vec_bytes) {
  const std::int64_t vectors = vectors_per_row(problem, vec_bytes);
  for (int cta : kReduceCtaThreads) {
    if (cta >= std::min<std::int64_t>(vectors, 256)) {
      return cta;
    }
  }
  return kReduceCtaThreads.back();
}

std::string flag_names(Op op) {
  switch (op) {
    case Op::swiglu_backward:
      return "flat (1)";
    case Op::geglu_backward:
      return "flat (1), erf (2)";
    case Op::clamped_swiglu_backward:
      return "flat (1), interleaved (128)";
    default:
      return "flat (1), erf (2), bias (4)";
  }
}

}  // namespace

ActivationBackwardFamily::ActivationBackwardFamily(Op op) : op_(op) {
  if (op != Op::swiglu_backward && op != Op::geglu_backward && op != Op::gelu_backward &&
      op != Op::clamped_swiglu_backward) {
    throw Error("kiln: the activation backward family has no op " + std::string(op_name(op)));
  }
}

std::uint32_t ActivationBackwardFamily::allowed_flags() const {
  switch (op_) {
    case Op::swiglu_backward:
      return kElementwiseFlat;
    case Op::geglu_backward:
      return kElementwiseFlat | kGeluErf;
    case Op::clamped_swiglu_backward:
      return kElementwiseFlat | kPackedInterleaved;
    default:
      return kElementwiseFlat | kGeluErf | kGeluHasBias;
  }
}

bool ActivationBackwardFamily::reduces_bias(const Problem& problem) {
  return problem.op == Op::gelu_backward && (problem.flags & kGeluHasBias) != 0;
}

std::int64_t ActivationBackwardFamily::row_groups(std::int64_t rows) {
  const std::int64_t wanted = std::max(ceil_div(std::max<std::int64_t>(rows, 0), kRowsPerGroup),
                                       std::min<std::int64_t>(rows, kMinRowGroups));
  return std::clamp<std::int64_t>(wanted, 1, kMaxRowGroups);
}

void ActivationBackwardFamily::check(const Problem& problem) const {
  ElementwiseFamily::check_pointwise(*this, problem, allowed_flags(), flag_names(op_));
  const std::string op(name());
  if ((problem.flags & kElementwiseFlat) != 0 && (problem.flags & kGeluHasBias) != 0) {
    throw ArgumentError(op, "flags", "no flat layout with a bias (a sum over rows)",
                        std::to_string(problem.flags));
  }
}

std::string ActivationBackwardFamily::invalid_reason(const Problem& problem, const Config& config,
                                                     const DeviceTraits& device) const {
  try {
    check(problem);
  } catch (const ArgumentError& error) {
    return error.message();
  }
  const bool reduce = reduces_bias(problem);
  for (const auto& [key, value] : config.extra) {
    if (key != "unroll" && (reduce || key != "max_ctas")) {
      return std::string(name()) + " has no tunable named '" + key + "'" +
             (reduce ? " with a bias" : "");
    }
  }
  const int widest = ElementwiseFamily::widest_vector(problem);
  if (config.vec_bytes != widest) {
    return "vec_bytes " + std::to_string(config.vec_bytes) + " is not " + std::to_string(widest) +
           ", the widest access the data's alignment and row width allow";
  }
  if (config.threads_per_row != 1) {
    return "threads_per_row " + std::to_string(config.threads_per_row) +
           " is not 1: a thread owns whole vectors, no row is split among threads";
  }
  const int cta = config.cta_threads;
  const std::int64_t unroll = config.extra_or("unroll", 0);
  if (reduce) {
    if (!one_of(kReduceCtaThreads, cta)) {
      return "cta_threads " + std::to_string(cta) + " is not " + list_of(kReduceCtaThreads);
    }
    if (!one_of(kReduceUnrolls, unroll)) {
      return "unroll " + std::to_string(unroll) + " is not " + list_of(kReduceUnrolls);
    }
    const std::int64_t vectors = vectors_per_row(problem, config.vec_bytes);
    if (cta > kReduceCtaThreads.front() && cta / 2 >= vectors) {
      return "cta_threads " + std::to_string(cta) + " leaves half the CTA idle: a row has " +
             std::to_string(vectors) + " vectors";
    }
  } else {
    if (!one_of(kPassCtaThreads, cta)) {
      return "cta_threads " + std::to_string(cta) + " is not " + list_of(kPassCtaThreads);
    }
    if (!one_of(kPassUnrolls, unroll)) {
      return "unroll " + std::to_string(unroll) + " is not " + list_of(kPassUnrolls);
    }
    const std::int64_t max_ctas = config.extra_or("max_ctas", -1);
    const std::int64_t wave = ElementwiseFamily::wave_ctas(device, cta);
    if (max_ctas != 0 && max_ctas != wave) {
      return "max_ctas " + std::to_string(max_ctas) + " is neither 0 (cover the data once) nor " +
             std::to_string(wave) + " (one resident wave of " + std::to_string(cta) +
             "-thread CTAs)";
    }
  }
  if (cta > device.max_threads_per_block) {
    return "cta_threads " + std::to_string(cta) + " exceeds the device's " +
           std::to_string(device.max_threads_per_block) + " threads per block";
  }
  // Every loaded vector of a step is held at once, plus the outputs' offsets (the pass) or
  // the bias and the running sums in fp32 (the reduction).
  const std::int64_t words = std::max(1, config.vec_bytes / 4);
  const std::int64_t elements =
      config.vec_bytes / static_cast<std::int64_t>(dtype_size(problem.dtype));
  const std::int64_t loads = reduce ? 2 : gated(op_) ? 3 : 2;
  const std::int64_t registers = loads * unroll * words + kRegisterOverhead +
                                 (reduce ? 2 * elements : (gated(op_) ? 4 : 2) * unroll);
  const int register_cap =
      std::min(kMaxRegistersPerThread, std::max(1, device.regs_per_block / cta));
  if (registers > register_cap) {
    return "holding " + std::to_string(unroll) + " steps of " + std::to_string(loads) +
           " operands needs about " + std::to_string(registers) +
           " registers per thread, more than the " + std::to_string(register_cap) + " a " +
           std::to_string(cta) + "-thread CTA allows";
  }
  return {};
}

std::vector<Config> ActivationBackwardFamily::space(const Problem& problem,
                                                    const DeviceTraits& device) const {
  check(problem);
  std::vector<Config> configs;
  auto consider = [&](int cta, int unroll, std::optional<std::int64_t> max_ctas) {
    Config config;
    config.vec_bytes = ElementwiseFamily::widest_vector(problem);
    config.threads_per_row = 1;
    config.cta_threads = cta;
    config.extra["unroll"] = unroll;
    if (max_ctas) {
      config.extra["max_ctas"] = *max_ctas;
    }
    if (invalid_reason(problem, config, device).empty()) {
      configs.push_back(std::move(config));
    }
  };
  if (reduces_bias(problem)) {
    for (int cta : kReduceCtaThreads) {
      for (int unroll : kReduceUnrolls) {
        consider(cta, unroll, std::nullopt);
      }
    }
    return configs;
  }
  for (int cta : kPassCtaThreads) {
    for (int unroll : kPassUnrolls) {
      for (std::int64_t max_ctas : {std::int64_t{0}, ElementwiseFamily::wave_ctas(device, cta)}) {
        consider(cta, unroll, max_ctas);
      }
    }
  }
  return configs;
}

Config ActivationBackwardFamily::heuristic(const Problem& problem,
                                           const DeviceTraits& device) const {
  check(problem);
  Config config;
  config.vec_bytes = ElementwiseFamily::widest_vector(problem);
  config.threads_per_row = 1;
  if (reduces_bias(problem)) {
    config.cta_threads = reduce_target_cta(problem, config.vec_bytes);
    config.extra["unroll"] = kReduceHeuristicUnroll;
  } else {
    config.cta_threads = std::min(kPassHeuristicCta, device.max_threads_per_block);
    config.extra["unroll"] = kPassHeuristicUnroll;
    config.extra["max_ctas"] = 0;
  }
  if (const std::string why = invalid_reason(problem, config, device); !why.empty()) {
    throw Error("kiln." + std::string(name()) + ": the heuristic config " + config.key() +
                " is invalid for " + problem.key() + ": " + why);
  }
  return config;
}

std::string ActivationBackwardFamily::name_expression(const Problem& problem,
                                                      const Config& config) const {
  auto flag = [&](std::uint32_t bit) { return (problem.flags & bit) != 0 ? "true" : "false"; };
  const std::string head =
      std::string(dtype_cuda_type(problem.dtype)) + ", " + std::to_string(problem.hidden) + ", " +
      std::to_string(config.vec_bytes) + ", " + std::to_string(config.cta_threads) + ", " +
      std::to_string(config.extra_or("unroll", 1)) + ", ";
  if (reduces_bias(problem)) {
    return "kiln::bias_gelu_backward<" + head + flag(kGeluErf) + ">";
  }
  std::string op;
  switch (op_) {
    case Op::swiglu_backward:
      op = "kiln::SiluMulBackward";
      break;
    case Op::geglu_backward:
      op = std::string("kiln::GeluMulBackward<") + flag(kGeluErf) + ">";
      break;
    case Op::clamped_swiglu_backward:
      op = std::string("kiln::ClampedSiluMulBackward<") + flag(kPackedInterleaved) + ">";
      break;
    default:
      op = std::string("kiln::GeluBackward<") + flag(kGeluErf) + ">";
      break;
  }
  return "kiln::activation_backward<" + head + flag(kElementwiseFlat) + ", " + op + ">";
}

LaunchGeometry ActivationBackwardFamily::geometry(const Problem& problem, const Config& config,
                                                  std::int64_t rows) const {
  LaunchGeometry geometry;
  geometry.block[0] = static_cast<std::uint32_t>(config.cta_threads);
  if (reduces_bias(problem)) {
    geometry.grid[0] =
        covering_grid(vectors_per_row(problem, config.vec_bytes), std::max(config.cta_threads, 1));
    geometry.grid[1] = static_cast<std::uint32_t>(row_groups(rows));
    return geometry;
  }
  const std::int64_t per_cta = std::int64_t{std::max(config.cta_threads, 1)} *
                               std::max<std::int64_t>(config.extra_or("unroll", 1), 1);
  geometry.grid[0] =
      covering_grid(ElementwiseFamily::vectors(problem, config.vec_bytes, rows), per_cta);
  const std::int64_t max_ctas = config.extra_or("max_ctas", 0);
  if (max_ctas > 0 && geometry.grid[0] > max_ctas) {
    geometry.grid[0] = static_cast<std::uint32_t>(max_ctas);
  }
  return geometry;
}

std::vector<BufferSpec> ActivationBackwardFamily::buffers(const Problem& problem,
                                                          std::int64_t rows) const {
  check(problem);
  if (rows < 0) {
    throw ArgumentError(std::string(name()), "rows", "a count >= 0", std::to_string(rows));
  }
  const std::int64_t n = rows * problem.hidden;
  const DType t = problem.dtype;
  if (interleaved(problem)) {
    return {{"gate_up", t, 2 * n, false}, {"dy", t, n, false}, {"dgate_up", t, 2 * n, true}};
  }
  if (gated(op_)) {
    return {{"gate", t, n, false},
            {"up", t, n, false},
            {"dy", t, n, false},
            {"dgate", t, n, true},
            {"dup", t, n, true}};
  }
  if (reduces_bias(problem)) {
    return {{"x", t, n, false},
            {"bias", t, problem.hidden, false},
            {"dy", t, n, false},
            {"dx", t, n, true},
            {"partials", DType::f32, row_groups(rows) * problem.hidden, true}};
  }
  return {{"x", t, n, false}, {"dy", t, n, false}, {"dx", t, n, true}};
}

std::vector<std::byte> ActivationBackwardFamily::pack_params(
    const Problem& problem, std::int64_t rows, std::span<const std::uint64_t> addresses) const {
  const std::size_t expected = buffers(problem, rows).size();
  if (addresses.size() != expected) {
    throw Error("kiln." + std::string(name()) + ": pack_params: expected " +
                std::to_string(expected) + " addresses (the buffers() order), got " +
                std::to_string(addresses.size()));
  }
  auto pointer = [&](std::size_t i) {
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(addresses[i]));
  };
  ActivationBackwardParams params;
  std::memset(&params, 0, sizeof(params));  // deterministic padding and unused fields
  params.rows = rows;
  params.a_row_stride = params.dy_row_stride = problem.hidden;
  params.out0_row_stride = params.out1_row_stride = problem.hidden;
  params.a = pointer(0);
  params.alpha = kClampedSwigluAlpha;
  params.limit = kClampedSwigluLimit;
  if (interleaved(problem)) {
    params.a_row_stride = params.out0_row_stride = 2 * problem.hidden;
    params.dy = pointer(1);
    params.out0 = pointer(2);
  } else if (gated(op_)) {
    params.b = pointer(1);
    params.b_row_stride = problem.hidden;
    params.dy = pointer(2);
    params.out0 = pointer(3);
    params.out1 = pointer(4);
  } else if (reduces_bias(problem)) {
    params.b = pointer(1);  // row stride 0: one bias row for every row
    params.dy = pointer(2);
    params.out0 = pointer(3);
    params.partials = static_cast<float*>(pointer(4));
  } else {
    params.dy = pointer(1);
    params.out0 = pointer(2);
  }
  std::vector<std::byte> bytes(sizeof(params));
  std::memcpy(bytes.data(), &params, sizeof(params));
  return bytes;
}

std::int64_t ActivationBackwardFamily::bytes_moved(const Problem& problem,
                                                   std::int64_t rows) const {
  std::int64_t bytes = 0;
  for (const BufferSpec& spec : buffers(problem, rows)) {
    bytes += spec.elements * static_cast<std::int64_t>(dtype_size(spec.dtype));
  }
  return bytes;
}

std::vector<Problem> ActivationBackwardFamily::common_problems(
    DType dtype, std::int64_t hidden, const PrewarmModel& /*model*/) const {
  // Rows back to back (flat) take only the allocations' addresses into the alignment; rows
  // apart take their width too.
  const std::uint32_t rows_apart = row_alignment({row_bytes(dtype, hidden)});
  auto make = [&](std::uint32_t flags) {
    return Problem{op_, dtype, hidden, flags, (flags & kElementwiseFlat) != 0 ? 16u : rows_apart};
  };
  switch (op_) {
    case Op::swiglu_backward:  // two tensors; one packed gate_up tensor
      return {make(kElementwiseFlat), make(0)};
    case Op::geglu_backward:
      return {make(kElementwiseFlat), make(0), make(kElementwiseFlat | kGeluErf), make(kGeluErf)};
    case Op::clamped_swiglu_backward:  // as the forward's (elementwise_family.cpp)
      return {make(kPackedInterleaved | kElementwiseFlat), make(kPackedInterleaved)};
    default:
      return {make(kElementwiseFlat), make(kGeluHasBias), make(kElementwiseFlat | kGeluErf),
              make(kGeluHasBias | kGeluErf)};
  }
}

}  // namespace kiln
