#include "templates/types.h"

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "cache/error.h"

namespace kiln {
namespace {

constexpr std::array<DType, 3> kDTypes = {DType::f32, DType::f16, DType::bf16};
constexpr std::array kOps = {
    // clang-format off
    Op::rms_norm,    Op::fused_add_rms_norm,
    Op::layer_norm,  Op::adaln,
    Op::gated_adaln, Op::rope,
    Op::rope_3d,     Op::rms_norm_rope,
    Op::swiglu,      Op::geglu,
    Op::gelu,        Op::gated_residual,
    Op::rms_norm_backward,
    Op::fused_add_rms_norm_backward,
    Op::layer_norm_backward,
    Op::adaln_backward,
    Op::swiglu_backward,
    Op::geglu_backward,
    Op::gelu_backward,
    Op::rms_norm_gated,
    Op::clamped_swiglu,
    Op::clamped_swiglu_backward,
    // clang-format on
};

std::string known_ops() {
  std::string text;
  for (Op op : kOps) {
    text += (text.empty() ? "" : ", ") + std::string(op_name(op));
  }
  return text;
}

}  // namespace

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "fp32";
    case DType::f16:
      return "fp16";
    case DType::bf16:
      return "bf16";
  }
  return "?";
}

std::string_view dtype_cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float";
    case DType::f16:
      return "kiln::f16";
    case DType::bf16:
      return "kiln::bf16";
  }
  return "?";
}

std::size_t dtype_size(DType dtype) {
  return dtype == DType::f32 ? 4 : 2;
}

// The spellings of torch ("float32", "bfloat16"), of C ("float", "half") and kiln's own.
std::optional<DType> parse_dtype(std::string_view text) {
  if (text == "fp32" || text == "float32" || text == "float") {
    return DType::f32;
  }
  if (text == "fp16" || text == "float16" || text == "half") {
    return DType::f16;
  }
  if (text == "bf16" || text == "bfloat16") {
    return DType::bf16;
  }
  return std::nullopt;
}

std::string_view op_name(Op op) {
  switch (op) {
    case Op::rms_norm:
      return "rms_norm";
    case Op::fused_add_rms_norm:
      return "fused_add_rms_norm";
    case Op::layer_norm:
      return "layer_norm";
    case Op::adaln:
      return "adaln";
    case Op::gated_adaln:
      return "gated_adaln";
    case Op::rope:
      return "rope";
    case Op::rope_3d:
      return "rope_3d";
    case Op::rms_norm_rope:
      return "rms_norm_rope";
    case Op::swiglu:
      return "swiglu";
    case Op::geglu:
      return "geglu";
    case Op::gelu:
      return "gelu";
    case Op::gated_residual:
      return "gated_residual";
    case Op::rms_norm_backward:
      return "rms_norm_backward";
    case Op::fused_add_rms_norm_backward:
      return "fused_add_rms_norm_backward";
    case Op::layer_norm_backward:
      return "layer_norm_backward";
    case Op::adaln_backward:
      return "adaln_backward";
    case Op::swiglu_backward:
      return "swiglu_backward";
    case Op::geglu_backward:
      return "geglu_backward";
    case Op::gelu_backward:
      return "gelu_backward";
    case Op::rms_norm_gated:
      return "rms_norm_gated";
    case Op::clamped_swiglu:
      return "clamped_swiglu";
    case Op::clamped_swiglu_backward:
      return "clamped_swiglu_backward";
  }
  return "?";
}

std::optional<Op> backward_of(Op op) {
  switch (op) {
    case Op::rms_norm:
      return Op::rms_norm_backward;
    case Op::fused_add_rms_norm:
      return Op::fused_add_rms_norm_backward;
    case Op::layer_norm:
      return Op::layer_norm_backward;
    case Op::adaln:
      return Op::adaln_backward;
    case Op::swiglu:
      return Op::swiglu_backward;
    case Op::geglu:
      return Op::geglu_backward;
    case Op::gelu:
      return Op::gelu_backward;
    case Op::clamped_swiglu:
      return Op::clamped_swiglu_backward;
    default:
      return std::nullopt;
  }
}

std::optional<Op> parse_op(std::string_view text) {
  for (Op op : kOps) {
    if (text == op_name(op)) {
      return op;
    }
  }
  return std::nullopt;
}

std::string Problem::key() const {
  std::string text = std::string(op_name(op)) + "." + std::string(dtype_name(dtype)) + ".h" +
                     std::to_string(hidden) + ".f" + std::to_string(flags) + ".a" +
                     std::to_string(align);
  if (aux != 0) {
    text += ".x" + std::to_string(aux);
  }
  return text;
}

std::string Config::key() const {
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "v" + std::to_string().
  std::string text = "v";
  text += std::to_string(vec_bytes);
  text += ".t";
  text += std::to_string(threads_per_row);
  text += ".c";
  text += std::to_string(cta_threads);
  for (const auto& [name, value] : extra) {
    text += '.';
    text += name;
    text += '=';
    text += std::to_string(value);
  }
  return text;
}

// ---------------------------------------------------------------------------------------
// JSON. Readers check every field themselves, so a malformed file reports what was wrong
// in kiln's words rather than as a library type error.

namespace {

const nlohmann::json& require(const nlohmann::json& j, const char* what, const char* field) {
  if (!j.is_object()) {
    throw Error(std::string(what) + " JSON: expected an object, got " + j.dump());
  }
  const auto it = j.find(field);
  if (it == j.end()) {
    throw Error(std::string(what) + " JSON: expected field \"" + field + "\", got " + j.dump());
  }
  return *it;
}

// The value of an integer JSON number if it lies in [min, max].
std::optional<std::int64_t> integer_in(const nlohmann::json& value, std::int64_t min,
                                       std::int64_t max) {
  if (!value.is_number_integer()) {
    return std::nullopt;
  }
  if (value.is_number_unsigned()) {
    const auto v = value.get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(max) || static_cast<std::int64_t>(v) < min) {
      return std::nullopt;
    }
    return static_cast<std::int64_t>(v);
  }
  const auto v = value.get<std::int64_t>();
  if (v < min || v > max) {
    return std::nullopt;
  }
  return v;
}

std::int64_t require_integer(const nlohmann::json& j, const char* what, const char* field,
                             std::int64_t min, std::int64_t max) {
  const nlohmann::json& value = require(j, what, field);
  const auto v = integer_in(value, min, max);
  if (!v) {
    throw Error(std::string(what) + " JSON: \"" + field + "\": expected an integer in [" +
                std::to_string(min) + ", " + std::to_string(max) + "], got " + value.dump());
  }
  return *v;
}

std::string require_string(const nlohmann::json& j, const char* what, const char* field) {
  const nlohmann::json& value = require(j, what, field);
  if (!value.is_string()) {
    throw Error(std::string(what) + " JSON: \"" + field + "\": expected a string, got " +
                value.dump());
  }
  return value.get<std::string>();
}

constexpr std::int64_t kIntMax = 0x7fffffff;

}  // namespace

void to_json(nlohmann::json& j, const Config& config) {
  j = nlohmann::json{{"vec_bytes", config.vec_bytes},
                     {"threads_per_row", config.threads_per_row},
                     {"cta_threads", config.cta_threads}};
  nlohmann::json extra = nlohmann::json::object();
  for (const auto& [name, value] : config.extra) {
    extra[name] = value;
  }
  j["extra"] = std::move(extra);
}

void from_json(const nlohmann::json& j, Config& config) {
  constexpr const char* kWhat = "kiln config";
  Config result;
  result.vec_bytes = static_cast<int>(require_integer(j, kWhat, "vec_bytes", 1, kIntMax));
  result.threads_per_row =
      static_cast<int>(require_integer(j, kWhat, "threads_per_row", 1, kIntMax));
  result.cta_threads = static_cast<int>(require_integer(j, kWhat, "cta_threads", 1, kIntMax));
  if (const auto it = j.find("extra"); it != j.end()) {
    if (!it->is_object()) {
      throw Error(std::string(kWhat) + " JSON: \"extra\": expected an object, got " + it->dump());
    }
    for (const auto& [name, value] : it->items()) {
      const auto v = integer_in(value, INT64_MIN, INT64_MAX);
      if (!v) {
        throw Error(std::string(kWhat) + " JSON: \"extra\": \"" + name +
                    "\": expected an integer, got " + value.dump());
      }
      result.extra[name] = *v;
    }
  }
  config = std::move(result);
}

void to_json(nlohmann::json& j, const Problem& problem) {
  j = nlohmann::json{{"op", op_name(problem.op)},
                     {"dtype", dtype_name(problem.dtype)},
                     {"hidden", problem.hidden},
                     {"flags", problem.flags},
                     {"align", problem.align}};
  if (problem.aux != 0) {
    j["aux"] = problem.aux;
  }
}

void from_json(const nlohmann::json& j, Problem& problem) {
  constexpr const char* kWhat = "kiln problem";
  Problem result;
  const std::string op = require_string(j, kWhat, "op");
  const auto parsed_op = parse_op(op);
  if (!parsed_op) {
    throw Error(std::string(kWhat) + " JSON: \"op\": expected a known op (" + known_ops() +
                "), got \"" + op + "\"");
  }
  result.op = *parsed_op;
  const std::string dtype = require_string(j, kWhat, "dtype");
  const auto parsed_dtype = parse_dtype(dtype);
  if (!parsed_dtype) {
    throw Error(std::string(kWhat) + " JSON: \"dtype\": expected fp32, fp16 or bf16, got \"" +
                dtype + "\"");
  }
  result.dtype = *parsed_dtype;
  result.hidden = require_integer(j, kWhat, "hidden", 1, INT64_MAX);
  result.flags = static_cast<std::uint32_t>(require_integer(j, kWhat, "flags", 0, 0xffffffffll));
  const std::int64_t align = require_integer(j, kWhat, "align", 1, 16);
  if ((align & (align - 1)) != 0) {
    throw Error(std::string(kWhat) + " JSON: \"align\": expected a power of two in [1, 16], got " +
                std::to_string(align));
  }
  result.align = static_cast<std::uint32_t>(align);
  if (j.contains("aux")) {
    result.aux = require_integer(j, kWhat, "aux", 0, INT64_MAX);
  }
  problem = result;
}

// ---------------------------------------------------------------------------------------
// Known archs, each described by the datacenter part most deployments of it use, newest
// first. A field left out keeps DeviceTraits' default: 1024 threads a block, 64 K registers
// an SM and a block, 48 KB of shared memory a block without opting in.

namespace {

constexpr DeviceTraits kKnownArchs[] = {
    {.sm = 90,  // H100 SXM
     .sm_count = 132,
     .max_threads_per_sm = 2048,
     .smem_per_block_optin = std::int64_t{227} * 1024,
     .smem_per_sm = std::int64_t{228} * 1024,
     .l2_bytes = std::int64_t{50} * 1024 * 1024},
    {.sm = 89,  // L4
     .sm_count = 58,
     .max_threads_per_sm = 1536,
     .smem_per_block_optin = std::int64_t{99} * 1024,
     .smem_per_sm = std::int64_t{100} * 1024,
     .l2_bytes = std::int64_t{48} * 1024 * 1024},
    {.sm = 86,  // A10
     .sm_count = 72,
     .max_threads_per_sm = 1536,
     .smem_per_block_optin = std::int64_t{99} * 1024,
     .smem_per_sm = std::int64_t{100} * 1024,
     .l2_bytes = std::int64_t{6} * 1024 * 1024},
    {.sm = 80,  // A100
     .sm_count = 108,
     .max_threads_per_sm = 2048,
     .smem_per_block_optin = std::int64_t{163} * 1024,
     .smem_per_sm = std::int64_t{164} * 1024,
     .l2_bytes = std::int64_t{40} * 1024 * 1024},
    {.sm = 75,  // T4
     .sm_count = 40,
     .max_threads_per_sm = 1024,
     .smem_per_block_optin = std::int64_t{64} * 1024,
     .smem_per_sm = std::int64_t{64} * 1024,
     .l2_bytes = std::int64_t{4} * 1024 * 1024},
};

}  // namespace

// An arch newer than the table (sm_100, ...) gets the traits of the newest known one below
// it, keeping its own `sm` so code generation still targets it. Archs older than sm_75 are
// not supported by CUDA 13's NVRTC.
DeviceTraits DeviceTraits::for_arch(int sm) {
  for (const DeviceTraits& known : kKnownArchs) {
    if (sm >= known.sm) {
      DeviceTraits traits = known;
      traits.sm = sm;
      return traits;
    }
  }
  throw ArgumentError("device", "sm", "a compute capability of at least 7.5 (sm_75)",
                      "sm_" + std::to_string(sm));
}

}  // namespace kiln
