// The activation family: swiglu, geglu, gelu, gated_residual and clamped_swiglu (GPT-OSS's
// expert gate), all one elementwise pass
// (kiln::elementwise in templates/kiln/elementwise.cuh) that differs only in the op applied
// per element and in which operands it reads. One ElementwiseFamily object per op.
//
// Problem: hidden = the output row width (for a packed [..., 2I] gate_up input, I), rows =
// the product of the leading dimensions. Whether gate and up come from two tensors or from
// the two halves of one packed tensor, and in which order, is not part of the problem: the
// kernel sees two operands with their own base address and row stride either way, so both
// forms share one compiled kernel (their alignments may differ, which `align` captures).
//
// Config: vec_bytes (always the widest the data allows: a narrower access only issues more
// instructions for the same bytes), threads_per_row = 1 (no row is split: there is no
// reduction), cta_threads, and two extras: "unroll" (vectors per thread per step, all loads
// of a step in flight together) and "max_ctas" (0: the grid covers the data once; otherwise
// a grid of one resident wave that strides over the data).
#pragma once

#include <cstdint>
#include <string>

#include "templates/family.h"

namespace kiln {

// Problem::flags bits of the activation ops.
// Every operand is rows * hidden contiguous elements (no broadcast): the kernel runs over
// one flat array, so widths that are not whole vectors keep full-width accesses.
inline constexpr std::uint32_t kElementwiseFlat = 1u;
// geglu and gelu: the erf form (F.gelu(approximate='none')) instead of the tanh approximation.
inline constexpr std::uint32_t kGeluErf = 2u;
// gelu: a bias of [hidden] is added before the activation.
inline constexpr std::uint32_t kGeluHasBias = 4u;
// gated_residual: the gate has one row per sample (rows_per_sample rows), not per token.
inline constexpr std::uint32_t kGatePerSample = 8u;
// gated_residual: the output is h itself (h is read with coherent loads).
inline constexpr std::uint32_t kGatedResidualInPlace = 16u;
// Any op: the call is large enough that the kernel's vector indices may pass 2^32, so it
// indexes in 64 bits (32 otherwise). Set by the host from the call's size
// (ElementwiseFamily::needs_index64), never by the tuner.
inline constexpr std::uint32_t kElementwiseIndex64 = 32u;
// gated_residual: one gate row for every row (a [D] gate, or the [1, 1, D] gate of a single
// sample), read with row stride 0. The kernel is the per-token one, whose gate stride is a
// parameter; the flag is for the tuner, whose stand-alone run would otherwise time a per-token
// gate as large as h: a fourth full stream that such a call never reads (tuned 1.3x slower
// than its calls ran, and ranked for that traffic).
inline constexpr std::uint32_t kGateShared = 64u;
// clamped_swiglu: gate and up are the interleaved pairs of one packed [..., 2I] row (GPT-OSS's
// gate_up_proj), not its two halves. The kernel reads each output vector's pairs as two vectors
// at twice its column; the problem's hidden is still I.
inline constexpr std::uint32_t kPackedInterleaved = 128u;

// clamped_swiglu's scalars in a stand-alone (evaluator) run: GPT-OSS's. They are kernel
// parameters, so every value a call passes runs the same compiled kernel, at the same speed.
inline constexpr float kClampedSwigluAlpha = 1.702f;
inline constexpr float kClampedSwigluLimit = 7.0f;

class ElementwiseFamily : public Family {
 public:
  static constexpr std::int64_t kMaxHidden = std::int64_t{1} << 24;
  // The rows one sample holds in a stand-alone (evaluator) run of a per-sample gate.
  static constexpr std::int64_t kStandaloneRowsPerSample = 256;

  explicit ElementwiseFamily(Op op);

  Op op() const override { return op_; }
  std::string_view header() const override { return "kiln/elementwise.cuh"; }

  void check(const Problem& problem) const override;
  std::vector<Config> space(const Problem& problem, const DeviceTraits& device) const override;
  std::string invalid_reason(const Problem& problem, const Config& config,
                             const DeviceTraits& device) const override;
  Config heuristic(const Problem& problem, const DeviceTraits& device) const override;

  std::string name_expression(const Problem& problem, const Config& config) const override;
  LaunchGeometry geometry(const Problem& problem, const Config& config,
                          std::int64_t rows) const override;

  std::vector<BufferSpec> buffers(const Problem& problem, std::int64_t rows) const override;
  std::vector<std::byte> pack_params(const Problem& problem, std::int64_t rows,
                                     std::span<const std::uint64_t> addresses) const override;
  std::int64_t bytes_moved(const Problem& problem, std::int64_t rows) const override;
  std::vector<Problem> common_problems(DType dtype, std::int64_t hidden,
                                       const PrewarmModel& model) const override;

  // The flag bits this op accepts.
  std::uint32_t allowed_flags() const;
  // The checks of a pointwise op's problem, forward or backward: `family`'s own op, a row
  // width in [1, kMaxHidden], an alignment that is a power of two in [1, 16] bytes, no flag
  // beyond `allowed_flags` (named `allowed_names`). Throws ArgumentError naming the op.
  static void check_pointwise(const Family& family, const Problem& problem,
                              std::uint32_t allowed_flags, const std::string& allowed_names);
  // Vectors of vec_bytes the kernel's main loop covers for `rows` rows.
  static std::int64_t vectors(const Problem& problem, int vec_bytes, std::int64_t rows);
  // A grid of one resident wave of `cta_threads`-thread CTAs on the device.
  static std::int64_t wave_ctas(const DeviceTraits& device, int cta_threads);
  // The widest vector the problem's data allows.
  static int widest_vector(const Problem& problem);
  // Whether a call writing `elements` output elements needs kElementwiseIndex64, whatever
  // config runs it: its loop may form indices up to twice the vector count plus one step of
  // the largest resident grid.
  static bool needs_index64(std::int64_t elements);

 private:
  Op op_;
};

}  // namespace kiln
