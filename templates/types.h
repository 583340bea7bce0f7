// The vocabulary shared by every layer above cache/: what is specialised (Problem),
// what is tuned (Config), what the target looks like (DeviceTraits) and how a kernel
// is launched (LaunchGeometry). Plain data, no CUDA.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace kiln {

enum class DType : std::uint8_t { f32, f16, bf16 };

std::string_view dtype_name(DType dtype);       // "fp32" | "fp16" | "bf16"
std::string_view dtype_cuda_type(DType dtype);  // "float" | "kiln::f16" | "kiln::bf16"
std::size_t dtype_size(DType dtype);
std::optional<DType> parse_dtype(std::string_view text);  // also accepts float32/half/bfloat16...

// Every op kiln specialises; each has exactly one family (templates/registry.cpp).
enum class Op : std::uint8_t {
  rms_norm,
  fused_add_rms_norm,
  layer_norm,
  adaln,
  gated_adaln,
  rope,
  rope_3d,
  rms_norm_rope,
  swiglu,
  geglu,
  gelu,
  gated_residual,
  rms_norm_backward,
  fused_add_rms_norm_backward,
  layer_norm_backward,
  adaln_backward,
  swiglu_backward,
  geglu_backward,
  gelu_backward,
  rms_norm_gated,
  clamped_swiglu,
  clamped_swiglu_backward,
};

std::string_view op_name(Op op);
std::optional<Op> parse_op(std::string_view text);
// The op whose kernel computes `op`'s gradients, where it has one of its own (RoPE's backward
// is RoPE itself, rotating the other way: a flag of its problem, not another op).
std::optional<Op> backward_of(Op op);

// One specialisation: everything that is a compile-time constant of the kernel or that
// decides which configs are valid. `align` is the largest power of two (<= 16) dividing
// every pointer and row stride, in bytes, so vector width never exceeds what the data allows.
struct Problem {
  Op op = Op::rms_norm;
  DType dtype = DType::f32;
  std::int64_t hidden = 0;
  std::uint32_t flags = 0;  // family-specific bits (see the family's header)
  std::uint32_t align = 16;
  // A second compile-time size some families need (e.g. RoPE's rotary dim); 0 when unused.
  std::int64_t aux = 0;

  bool operator==(const Problem&) const = default;
  // Stable text form used in keys, file names and reports: "rms_norm.bf16.h4096.f1.a16"
  // (with ".x<aux>" appended when aux is not 0).
  std::string key() const;
};

// A point in a family's search space. The three common tunables are fields; anything a
// family adds lives in `extra` (sorted, so the key is stable).
struct Config {
  int vec_bytes = 16;        // bytes per vector load/store of one thread
  int threads_per_row = 32;  // threads cooperating on one row
  int cta_threads = 128;     // threads per CTA (so rows per CTA = cta_threads / threads_per_row)
  std::map<std::string, std::int64_t> extra;

  bool operator==(const Config&) const = default;
  int rows_per_cta() const { return cta_threads / threads_per_row; }
  // extra[name], or `absent` where the config does not set it (each family says what an
  // absent extra means).
  std::int64_t extra_or(const std::string& name, std::int64_t absent) const {
    const auto it = extra.find(name);
    return it == extra.end() ? absent : it->second;
  }
  // "v16.t32.c128" (+ ".name=value" for extras, in order).
  std::string key() const;
};

void to_json(nlohmann::json& j, const Config& config);
void from_json(const nlohmann::json& j, Config& config);
void to_json(nlohmann::json& j, const Problem& problem);
void from_json(const nlohmann::json& j, Problem& problem);

// What a family needs to know about a target to decide validity and geometry. Filled from
// the device probe on a GPU, or from a table of known archs when compiling offline.
struct DeviceTraits {
  int sm = 90;  // compute capability major*10 + minor
  int sm_count = 132;
  int max_threads_per_block = 1024;
  int max_threads_per_sm = 2048;
  int regs_per_sm = 65536;
  int regs_per_block = 65536;
  std::int64_t smem_per_block = 48 * 1024;
  std::int64_t smem_per_block_optin = 227 * 1024;
  std::int64_t smem_per_sm = 228 * 1024;
  std::int64_t l2_bytes = 50 * 1024 * 1024;
  int warp_size = 32;

  // Typical traits of an arch, for offline work (prewarm, `kiln compile`) with no GPU.
  static DeviceTraits for_arch(int sm);
};

struct LaunchGeometry {
  std::uint32_t grid[3] = {1, 1, 1};
  std::uint32_t block[3] = {1, 1, 1};
  std::uint32_t smem_bytes = 0;
};

}  // namespace kiln

template <>
struct std::hash<kiln::Problem> {
  std::size_t operator()(const kiln::Problem& p) const noexcept {
    std::uint64_t h = static_cast<std::uint64_t>(p.hidden);
    h = h * 0x9E3779B97F4A7C15ull ^
        (static_cast<std::uint64_t>(p.op) << 8 | static_cast<std::uint64_t>(p.dtype));
    h = h * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(p.flags) << 8 | p.align);
    h = h * 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(p.aux);
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
};
