// The backward ops of the normalisation ops, all on the kernels of one header
// (templates/kiln/norm_backward.cuh: kiln::norm_backward, and kiln::norm_backward_rows where
// nothing is summed across rows): rms_norm_backward, fused_add_rms_norm_backward,
// layer_norm_backward and adaln_backward. One object per op; they differ in which
// Problem::flags they accept and which kernel features follow. Each op also has the partial
// sums' problem (kNormSumPartials), whose kernel, kiln::sum_partials, adds up the fp32 partial
// rows of a call's parameter gradients.
//
// Tunables: vec_bytes, threads_per_row and cta_threads (hence rows per CTA), as the forward
// norms, the extra prefetch=1 (an item's next row loaded while the current one is worked,
// where the second row's registers fit; see item_kernel()), and past kMaxHiddenForRegisterSums
// the extra shared_sums=1 (the parameter sums held in shared memory, not registers). The grid is
// not tunable: the parameter gradients are reduced per item (see kiln/norm_backward_params.cuh),
// and the number of items is a function of the problem and the row counts only (slots()), so every
// config writes the same partial sums, which the tuner can then check against each other.
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
// Which gradients a call asks for, beside dx (always). By default an op returns the
// gradient of every parameter and operand it was given; a skip bit leaves one out (a frozen
// weight, LoRA's case), so the kernel neither sums nor writes it. The table bits ask adaln
// for the gradients of its table rows too: dscale and dy summed over every row.
inline constexpr std::uint32_t kNormSkipWeightGrad = 128u;
inline constexpr std::uint32_t kNormSkipBiasGrad = 256u;   // layer_norm
inline constexpr std::uint32_t kNormSkipScaleGrad = 512u;  // adaln
inline constexpr std::uint32_t kNormSkipShiftGrad = 1024u;
inline constexpr std::uint32_t kNormTableScaleGrad = 2048u;
inline constexpr std::uint32_t kNormTableShiftGrad = 4096u;
// The partial sums' own problem (no other bit with it): kiln::sum_partials adding up the
// fp32 partial rows a backward call wrote, per segment, into the gradient's dtype (the
// problem's). Its rows are the partial rows; its config splits the columns between CTAs
// (threads_per_row vectors a CTA) and the rows between a CTA's row lanes
// (cta_threads / threads_per_row).
inline constexpr std::uint32_t kNormSumPartials = 8192u;

class NormBackwardFamily : public Family {
 public:
  static constexpr std::int64_t kMaxHidden = NormFamily::kMaxHidden;
  static constexpr int kMaxElementsPerThread = 64;
  // An item is a group of threads in the grid as well as a partial row, so the item count
  // trades the grid's rows in flight against the partial sums written and added up after.
  // Measured on an H200 (bf16, 2688 and 16384 rows, fast tunes, the row-prefetching kernels
  // in the space): items of about 2^20 fp32 elements together, and at least 256 of them,
  // were fastest: rms_norm 2688x4096 39.4 us with 256 items against 48.5 with 1024 and 54.8
  // with 64; 16384x2048 74.6 us with 512 against 78.6 with 2048 and 109 with 128; at
  // 14848 wide 256 items against 64: 106 against 155 us at 2688 rows.
  static constexpr std::int64_t kPartialElements = std::int64_t{1} << 20;
  static constexpr std::int64_t kMinItems = 256;
  static constexpr std::int64_t kMaxItems = std::int64_t{1} << 16;
  // adaln's table rows with per-token operands: up to this width the kernel sums their
  // gradients beside the row (an fp32 sum per element held); wider, the sums' registers cost
  // more than a torch sum of dscale and dy after it. Measured on an H200 (bf16, fast tunes):
  // 2048 and 4096 wide 1-8% faster from 2688 rows and 20% at one row; 14848 wide 13-15%
  // slower (a 4-byte-vector split was all that fit). 8192 was not measured.
  static constexpr std::int64_t kMaxHiddenForTableSums = 8192;
  // Whether the kernel sums a table row's gradient over per-token operands at this width
  // (else the caller sums the per-token gradient after it).
  static bool table_sums_in_kernel(std::int64_t hidden) { return hidden <= kMaxHiddenForTableSums; }
  // Up to this width the space holds the parameter sums in registers only: on sm_90 a
  // LayerNorm 8192 wide has a config that neither spills nor drops the prefetch, and 14848 wide
  // none (every one spilled). Wider, a config whose sums do not fit its registers is offered
  // with shared_sums=1 instead (any config may be pinned with it).
  static constexpr std::int64_t kMaxHiddenForRegisterSums = 8192;
  // Dynamic shared memory a config takes for the parameter sums (0 without shared_sums).
  std::int64_t shared_sums_bytes(const Problem& problem, const Config& config) const;

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
  // Whether the problem is the partial sums' (kNormSumPartials).
  static bool sums_partials(const Problem& problem);
  // Whether a config runs kiln::norm_backward, whose groups work items of several rows (the
  // partial sums need them; a prefetching config loads an item's next row early), rather
  // than kiln::norm_backward_rows, one group per row. With nothing summed across rows both
  // are offered and the tuner chooses: on an H200 (bf16, frozen parameters) the fast tune
  // took the row kernel on every shape 2048 and 4096 wide, and the prefetching items on some
  // from 2688 rows at 14848 wide (BENCHMARKS.md).
  bool item_kernel(const Problem& problem, const Config& config) const;
  // Whether adaln's partial sums must be per sample (a [B, 1, D] operand's gradient is asked
  // for), not over every row.
  static bool sums_per_sample(std::uint32_t flags);

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
