// The backward ops of the normalisation ops, all on one kernel template
// (kiln::norm_backward in templates/kiln/norm_backward.cuh): rms_norm_backward,
// fused_add_rms_norm_backward, layer_norm_backward and adaln_backward. One object per op;
// they differ in which Problem::flags they accept and which kernel features follow.
//
// Tunables: vec_bytes, threads_per_row and cta_threads (hence rows per CTA), as the forward
// norms. The grid is not tunable: the parameter gradients are reduced per item (see
// kiln/norm_backward_params.cuh), and the number of items is a function of the problem and
// the row counts only (items()), so every config writes the same partial sums, which the
// tuner can then check against each other.
#pragma once

#include <cstdint>

#include "templates/family.h"
#include "templates/norm_family.h"

namespace kiln {

// Problem::flags bits of the backward ops. Weight, bias, layer and table mean what they mean
// for the forward ops (norm_family.h); the two per-token bits say which modulation operand is
// [B, T, D] (its gradient is then per token) rather than [B, 1, D] (summed per sample).
inline constexpr std::uint32_t kNormScalePerToken = kNormPerToken;  // 32
inline constexpr std::uint32_t kNormShiftPerToken = 64u;

class NormBackwardFamily : public Family {
 public:
  static constexpr std::int64_t kMaxHidden = NormFamily::kMaxHidden;
  static constexpr int kMaxElementsPerThread = 64;
  // Partial sums are at most about this many fp32 elements (16 MiB), whatever the row count:
  // a small second read next to the rows the kernel streams.
  static constexpr std::int64_t kPartialElements = std::int64_t{1} << 22;
  static constexpr std::int64_t kMinItems = 64;
  static constexpr std::int64_t kMaxItems = std::int64_t{1} << 16;

  explicit NormBackwardFamily(Op op);

  Op op() const override { return op_; }
  std::string_view header() const override { return "kiln/norm_backward.cuh"; }

  void check(const Problem& problem) const override;
  std::vector<Config> space(const Problem& problem, const DeviceTraits& device) const override;
  std::string invalid_reason(const Problem& problem, const Config& config,
                             const DeviceTraits& device) const override;
  Config heuristic(const Problem& problem, const DeviceTraits& device) const override;

  std::string name_expression(const Problem& problem, const Config& config) const override;
  LaunchGeometry geometry(const Problem& problem, const Config& config,
                          std::int64_t rows) const override;

  // A stand-alone run is one sample of `rows` tokens (modulation operands per token, or one
  // row), as the forward families' runs are.
  std::vector<BufferSpec> buffers(const Problem& problem, std::int64_t rows) const override;
  std::vector<std::byte> pack_params(const Problem& problem, std::int64_t rows,
                                     std::span<const std::uint64_t> addresses) const override;
  std::int64_t bytes_moved(const Problem& problem, std::int64_t rows) const override;
  std::vector<Problem> common_problems(DType dtype, std::int64_t hidden,
                                       const PrewarmModel& model) const override;

  std::uint32_t allowed_flags() const;
  // The kernel's FEATURES bits (NormBackwardFeature) for a problem of this op.
  unsigned features(const Problem& problem) const;
  // Whether the kernel writes partial sums at all (a parameter or a per-sample gradient).
  bool has_partials(const Problem& problem) const;

  // The items each of `segments` segments of `segment_rows` rows is split into: a power of
  // two, at most the segment's rows rounded up to one, and with every segment's items
  // together at most about kPartialElements / hidden partial rows.
  static std::int64_t slots(std::int64_t hidden, std::int64_t segment_rows, std::int64_t segments);
  // Groups of threads the grid holds for `rows` rows (each reduces one item at a time).
  static std::int64_t groups(std::int64_t hidden, std::int64_t rows);

  static std::int64_t elements_per_thread(const Problem& problem, const Config& config);
  std::int64_t registers_per_thread(const Problem& problem, const Config& config) const;

 private:
  Op op_;
};

}  // namespace kiln
