// The activation ops' backward family: swiglu_backward, geglu_backward and gelu_backward, on
// the kernels of templates/kiln/activation_backward.cuh. One ActivationBackwardFamily object
// per op.
//
// Problem: as the forward's (templates/elementwise_family.h), with the same flag bits:
// hidden = the forward output's row width (I for a packed [..., 2I] gate_up), kElementwiseFlat
// when every operand and output is rows of exactly `hidden` elements back to back, kGeluErf
// for the erf form, kGeluHasBias for gelu with a bias.
//
// Two kernels:
// - activation_backward (every problem but gelu with a bias): one elementwise pass, tuned as
//   the forward is (the widest vector the data allows, cta_threads, "unroll", "max_ctas").
// - bias_gelu_backward (gelu with a bias): a 2-D grid of column tiles (cta_threads vectors
//   wide) by row groups; each row group writes one fp32 row of column sums of dx, which the
//   caller adds up over the groups (dbias). The number of row groups depends on the row
//   count only (row_groups()), never on the config, so the caller can size the partial sums
//   without knowing which config the runtime picked. Tuned over cta_threads and "unroll"
//   (rows in flight per thread).
#pragma once

#include <cstdint>

#include "templates/elementwise_family.h"
#include "templates/family.h"

namespace kiln {

class ActivationBackwardFamily : public Family {
 public:
  static constexpr std::int64_t kMaxHidden = ElementwiseFamily::kMaxHidden;
  // Row groups of the bias reduction: about kRowsPerGroup rows each (so the partial sums are
  // a few percent of the bytes moved), at least min(rows, kMinRowGroups) groups (so small
  // batches still spread over the GPU), at most kMaxRowGroups.
  static constexpr std::int64_t kRowsPerGroup = 16;
  static constexpr std::int64_t kMinRowGroups = 64;
  static constexpr std::int64_t kMaxRowGroups = 512;

  explicit ActivationBackwardFamily(Op op);  // swiglu_backward, geglu_backward, gelu_backward

  Op op() const override { return op_; }
  std::string_view header() const override { return "kiln/activation_backward.cuh"; }

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

  std::uint32_t allowed_flags() const;
  // gelu_backward with a bias: the column-sum kernel.
  static bool reduces_bias(const Problem& problem);
  // The fp32 rows of partial column sums bias_gelu_backward writes for `rows` rows.
  static std::int64_t row_groups(std::int64_t rows);

 private:
  Op op_;
};

}  // namespace kiln
