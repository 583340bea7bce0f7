// The normalisation ops, all on one kernel template (kiln::norm in templates/kiln/norm.cuh):
// rms_norm, fused_add_rms_norm, layer_norm, adaln, gated_adaln and rms_norm_gated. One
// NormFamily object per op; they differ in which Problem::flags they accept, which kernel
// features those flags turn on, and which buffers a stand-alone run needs.
//
// Tunables: vec_bytes, threads_per_row, cta_threads (hence rows per CTA) and
// extra["grid"]: 0 launches one pass over the rows; N > 0 launches a persistent grid of N
// CTAs (SM count x resident CTAs of the target) whose threads prefetch their next row
// while reducing the current one; and extra["reread"] = 1 (one pass, rows of 4 KB and two
// or more steps per thread): the row (the fused ops' stored sum row) is read a second time,
// from L1 or L2, instead of held in registers (with the second input row or the scale and
// shift rows, where there are any) through the reduction, so more rows are in flight per SM;
// and extra["stage"] = 1 (sm_80+, 16 KB or more of row streams and two or more steps per
// thread, one pass):
// the row's streams are copied into shared memory with cp.async and read back from there
// (kiln::norm_staged), so a thread holds one step in registers and an SM keeps as many
// rows in flight as its shared memory holds.
// And extra["cluster"] = 2, 4 or 8 (sm_90, 16 KB or more of row streams, one row per CTA, one
// pass): each row is split over the CTAs of a thread-block cluster (kiln::norm_cluster),
// whose partial sums meet in distributed shared memory, so a few wide rows are read by that
// many more SMs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "templates/family.h"
#include "templates/kiln/norm_params.cuh"
#include "templates/norm_rules.h"

namespace kiln {

// Problem::flags bits of the norm ops (which op accepts which: NormFamily::allowed_flags).
inline constexpr std::uint32_t kNormWeight = 1u;     // multiply by weight[D]
inline constexpr std::uint32_t kNormBias = 2u;       // layer_norm: add bias[D]
inline constexpr std::uint32_t kNormLayer = 4u;      // adaln ops: LayerNorm instead of RMSNorm
inline constexpr std::uint32_t kNormInPlace = 8u;    // outputs overwrite the inputs
inline constexpr std::uint32_t kNormTable = 16u;     // adaln ops: operands add a table row
inline constexpr std::uint32_t kNormPerToken = 32u;  // adaln ops: operands are [B,T,D]
                                                     // (tuning only: same kernel, more bytes)
// Set by the host for a call of more rows than one pass of a grid covers
// (NormFamily::needs_row_loop), never by the tuner: its threads loop over the rows.
inline constexpr std::uint32_t kNormRowLoop = 64u;
// adaln ops with kNormTable: the table rows are fp32 for 16-bit x (Wan's scale_shift_table).
inline constexpr std::uint32_t kNormTableF32 = 128u;
// rms_norm_gated: the output's gate is sigmoid(z) (Kimi Linear, GLM-5 Next) instead of silu(z)
// (Qwen3-Next, Qwen3.5).
inline constexpr std::uint32_t kNormGateSigmoid = 256u;
// rms_norm_gated: x is gated before it is normalised, the output not (Mamba-2's gated norm, as
// mamba_ssm's norm_before_gate=False).
inline constexpr std::uint32_t kNormGateFirst = 512u;

class NormFamily : public Family {
 public:
  static constexpr std::int64_t kMaxHidden = kNormMaxHidden;
  static constexpr int kMaxElementsPerThread = 64;
  static constexpr float kDefaultEps = 1e-6f;

  explicit NormFamily(Op op);

  Op op() const override { return op_; }
  std::string_view header() const override { return "kiln/norm.cuh"; }

  void check(const Problem& problem) const override;
  std::vector<Config> space(const Problem& problem, const DeviceTraits& device) const override;
  std::string invalid_reason(const Problem& problem, const Config& config,
                             const DeviceTraits& device) const override;
  // held_heuristic() in the op's row form, where the space has it: re-read for rms_norm and
  // adaln; re-read for gated_adaln and, in twice the threads a row, fused_add_rms_norm, both
  // where the held split has fewer than 512 threads a row; staged for layer_norm.
  Config heuristic(const Problem& problem, const DeviceTraits& device) const override;
  // The one-pass config that holds the row in registers: the widest vector, about 32 elements
  // a thread (a split that idles fewer lanes where one is near), one to four rows a CTA.
  Config held_heuristic(const Problem& problem, const DeviceTraits& device) const;
  // At most one row per SM: the latency config (a finer split, one row a CTA).
  Config heuristic_for_rows(const Problem& problem, const DeviceTraits& device,
                            std::int64_t rows) const override;

  std::string name_expression(const Problem& problem, const Config& config) const override;
  LaunchGeometry geometry(const Problem& problem, const Config& config,
                          std::int64_t rows) const override;

  std::vector<BufferSpec> buffers(const Problem& problem, std::int64_t rows) const override;
  std::vector<std::byte> pack_params(const Problem& problem, std::int64_t rows,
                                     std::span<const std::uint64_t> addresses) const override;
  std::int64_t bytes_moved(const Problem& problem, std::int64_t rows) const override;
  // A clustered row only while the rows leave SMs without one (rows <= SM count).
  bool worth_measuring(const Problem& problem, const Config& config, const DeviceTraits& device,
                       std::int64_t rows) const override;
  std::vector<Problem> common_problems(DType dtype, std::int64_t hidden,
                                       const PrewarmModel& model) const override;
  // A row re-read ("reread") or staged in shared memory ("stage").
  std::span<const std::string_view> row_forms() const override;

  // The Problem::flags bits this op accepts.
  std::uint32_t allowed_flags() const;
  // Whether a call of `rows` rows needs kNormRowLoop, whatever the config: a grid of at most
  // 2^31 - 1 CTAs of at least one row each covers fewer.
  static bool needs_row_loop(std::int64_t rows);
  // The kernel's FEATURES bits (NormFeature in norm.cuh) for a problem of this op.
  unsigned features(const Problem& problem) const;
  // Registers a thread needs to hold its share of a row (and, with a persistent grid, of the
  // next row) under `config`: the estimate validity and the persistent grid size rest on.
  std::int64_t registers_per_thread(const Problem& problem, const Config& config) const;
  // Row elements each thread holds under `config`: its vectors, tail included.
  static std::int64_t elements_per_thread(const Problem& problem, const Config& config);

  // CTAs of `config` that fit on one SM of `device` at once (at least 1).
  int resident_ctas(const Problem& problem, const Config& config, const DeviceTraits& device) const;
  // The streams a thread loads for each row: x, the residual or y, and the per-token gate,
  // scale and shift where the op reads them. What a staged config (extra stage=1) copies
  // into shared memory, and what a persistent grid prefetches into registers.
  std::int64_t row_streams(const Problem& problem) const;
  // Bytes of those streams for one row: what staging holds, and what one SM (or a cluster)
  // pulls for the row.
  std::int64_t row_stream_bytes(const Problem& problem) const;
  // Dynamic shared memory per CTA of `config`: its staged rows, or 0 when it holds them.
  std::int64_t staged_smem_bytes(const Problem& problem, const Config& config) const;

 private:
  // space(), or an Error naming the problem when it is empty.
  std::vector<Config> valid_space(const Problem& problem, const DeviceTraits& device) const;
  // Why a staged config (extra stage=1) is invalid, or empty.
  std::string stage_reason(const Problem& problem, const Config& config,
                           const DeviceTraits& device) const;
  // Why a clustered config (extra cluster=N) is invalid, or empty.
  std::string cluster_reason(const Problem& problem, const Config& config,
                             const DeviceTraits& device) const;

  Op op_;
};

// The kernel's FEATURES bits (NormFeature in norm_params.cuh) for a problem of a norm op
// (problem.op).
unsigned norm_features(const Problem& problem);

// kiln::norm's parameter bytes: the pieces of a NormParams that the layout of a kernel of
// `features` holds (NormArgs in templates/kiln/norm_params.cuh), in its order.
struct NormArgBytes {
  alignas(8) std::array<std::byte, sizeof(NormParams)> bytes{};
  std::size_t size = 0;
};
NormArgBytes pack_norm_args(unsigned features, const NormParams& params);

}  // namespace kiln
