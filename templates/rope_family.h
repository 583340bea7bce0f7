// The RoPE families: kiln::rope in templates/kiln/rope.cuh, specialised as two ops:
//  - rope: cos/sin read from a table (fp32 or the data's dtype), half-split or interleaved,
//    over the first rotary_dim (Problem::aux, 0 = all) of each head;
//  - rope_3d: LTX-Video's angles computed from each token's (frame, row, column), no table,
//    interleaved over the whole row.
// Problem::hidden is the head dim D (the width one row rotates). A row is one head of one
// token (q's heads then k's, per token, in one launch), so a tuning bucket counts heads x
// tokens: the work, whatever the split between batch, sequence and heads.
// With kRopeHeadNorm each row is first RMS-normalised (head_norm_rope), its threads one
// warp's at most.
// Tunables: vec_bytes, threads_per_row, cta_threads, extra["rows_per_thread"] (1, 2, 4) and,
// for rope_3d only, extra["grid"]: N > 0 launches a persistent grid of N CTAs (SM count x
// resident CTAs, or twice that) whose threads load their next rows while they rotate the
// current ones and compute their angle frequencies once for all of them.
#pragma once

#include <cstdint>

#include "templates/family.h"
#include "templates/kiln/rope_params.cuh"

namespace kiln {

// Problem::flags bits of rope (rope_3d uses none: it is always interleaved, table-free, with
// one head each).
inline constexpr std::uint32_t kRopeInterleaved = 1u;
inline constexpr std::uint32_t kRopeTableF32 = 2u;  // cos/sin fp32 (else the data's dtype)
// The transposed rotation (RoPE's backward: q and k hold the gradients dy, the outputs dx).
// Same data movement as the forward; only the signs of the sin terms and which half's sin
// each output takes differ (see templates/kiln/rope.cuh).
inline constexpr std::uint32_t kRopeInverse = 4u;
// q and k laid out [B, H, S, D] (transformers; a head's positions contiguous), not
// [B, S, H, D]: the kernel walks rows positions-inner to follow memory (RopeParams), and the
// tuner's stand-alone run lays its buffers out the same way.
inline constexpr std::uint32_t kRopePositionsInner = 8u;
// q's and k's head counts are both even (kRopeHeadsEven), or both multiples of 4 (set with
// kRopeHeadsEven): a thread's 2 or 4 rows can then be a group of one token's heads in one
// tensor, which the kernel's grouped form walks with one place per thread (see
// templates/kiln/rope.cuh). The host sets them from the call's head counts.
inline constexpr std::uint32_t kRopeHeadsEven = 16u;
inline constexpr std::uint32_t kRopeHeadsBy4 = 32u;
// q and k have one head each (diffusers' [B, S, H * D] rows before the head split, as
// LTX-Video rotates them): a thread's 2 rows can be one token's q row and k row. rope_3d's
// calls always are, without the flag.
inline constexpr std::uint32_t kRopeOneHeadEach = 64u;
// cos/sin rows hold rotary_dim / 2 angles, one a rotation pair (GPT-OSS's tables, vLLM's
// cos/sin caches): half the table bytes of the [.., rotary_dim] tables, whose pairs repeat
// each angle.
inline constexpr std::uint32_t kRopeHalfTable = 128u;
// Each head RMS-normalised (with q's or k's weight, or none) before its rotation, and rounded
// to the data's dtype as a separate norm's output is: the per-head q/k norms of Qwen3, Gemma 3
// and FLUX fused with their RoPE (the op head_norm_rope). Forward only (not with kRopeInverse).
inline constexpr std::uint32_t kRopeHeadNorm = 256u;
// The row's first rotary_dim columns de-interleaved before a half-split rotation (columns 2j,
// 2j + 1 rotate as j, j + R/2 and are written there): DeepSeek-V3's MLA RoPE with
// rope_interleave. With kRopeInverse the transpose (read R/2 apart, written adjacent). Not with
// kRopeInterleaved or kRopeHeadNorm, and never in place.
inline constexpr std::uint32_t kRopeDeinterleave = 512u;
// Every flag that rope_head_flags() may set.
inline constexpr std::uint32_t kRopeHeadCountFlags =
    kRopeHeadsEven | kRopeHeadsBy4 | kRopeOneHeadEach;

// The head-count flags of a call with these head counts.
inline constexpr std::uint32_t rope_head_flags(std::int64_t heads_q, std::int64_t heads_k) {
  if (heads_q == 1 && heads_k == 1) {
    return kRopeOneHeadEach;
  }
  if (heads_q % 4 == 0 && heads_k % 4 == 0) {
    return kRopeHeadsEven | kRopeHeadsBy4;
  }
  if (heads_q % 2 == 0 && heads_k % 2 == 0) {
    return kRopeHeadsEven;
  }
  return 0u;
}

class RopeFamily : public Family {
 public:
  static constexpr std::int64_t kMaxHeadDim = 16384;
  // rows_per_thread: consecutive rows (heads) a thread rotates with one load of cos/sin.
  static constexpr const char* kRowsPerThread = "rows_per_thread";

  explicit RopeFamily(Op op);  // Op::rope or Op::rope_3d

  Op op() const override { return op_; }
  std::string_view header() const override { return "kiln/rope.cuh"; }

  void check(const Problem& problem) const override;
  std::vector<Config> space(const Problem& problem, const DeviceTraits& device) const override;
  std::string invalid_reason(const Problem& problem, const Config& config,
                             const DeviceTraits& device) const override;
  Config heuristic(const Problem& problem, const DeviceTraits& device) const override;

  std::string name_expression(const Problem& problem, const Config& config) const override;
  LaunchGeometry geometry(const Problem& problem, const Config& config,
                          std::int64_t rows) const override;

  // A stand-alone run: q and k [tokens, heads, D] ([heads, tokens, D] positions inner) with
  // cos/sin [tokens, rotary_dim] (table), heads 6 + 2 when rows divide by 8, else q's one
  // head; with head-count flags (and always for rope_3d), heads that keep them (24 + 8 or
  // 12 + 2 where the rows hold a token of them, else 4 + 4 or 2 + 2; one head each: 1 + 1)
  // over as many whole tokens as the rows hold.
  std::vector<BufferSpec> buffers(const Problem& problem, std::int64_t rows) const override;
  std::vector<std::byte> pack_params(const Problem& problem, std::int64_t rows,
                                     std::span<const std::uint64_t> addresses) const override;
  std::int64_t bytes_moved(const Problem& problem, std::int64_t rows) const override;
  std::vector<Problem> common_problems(DType dtype, std::int64_t hidden,
                                       const PrewarmModel& model) const override;

  static std::int64_t rotary_dim(const Problem& problem);
  // Angles a cos/sin row holds: rotary_dim, or half of it with kRopeHalfTable.
  static std::int64_t table_width(const Problem& problem);
  static int rows_per_thread(const Config& config);
  // How the config's kernel finds a thread's rows for every call of the problem: a group of
  // heads of one tensor (one row, or a count that the head-count flags say divides both
  // tensors'), one token's q and k rows (2 rows, one head each), or one by one.
  static RopeForm form(const Problem& problem, const Config& config);
  // Heads (q, k) per token of a stand-alone run of `rows` rows.
  static std::pair<int, int> standalone_heads(const Problem& problem, std::int64_t rows);

 private:
  Op op_;
};

}  // namespace kiln
