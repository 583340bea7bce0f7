// The fused q/k RMSNorm + interleaved RoPE family: kiln::rms_norm_rope in
// templates/kiln/rms_norm_rope.cuh (LTX-Video's attention prologue). Problem::hidden is
// the width of q and k rows (heads x head dim: the norm spans all heads, the rotation the
// whole row). A row is one token (its q row and its k row). Angles from a cos/sin table or,
// with kRmsNormRopeVideo, from the token's video coordinates. Problem::aux is 0 where a table
// row holds an angle for each column, or the head dim D where it holds D / 2, one for each
// rotation pair of a head, the same for every head (Wan's).
// Tunables: vec_bytes, threads_per_row, cta_threads and extra["grid"]: N > 0 launches a
// persistent grid of N CTAs (SM count x resident CTAs, or twice that) whose threads load
// their next token's q and k while they normalise and rotate the current one;
// extra["min_ctas"]: N > 0 asks the compiler for registers few enough for N CTAs an SM, where
// the one-pass kernel with coordinates parks its angles in shared memory.
#pragma once

#include <cstdint>

#include "templates/family.h"

namespace kiln {

inline constexpr std::uint32_t kRmsNormRopeVideo = 1u;
inline constexpr std::uint32_t kRmsNormRopeTableF32 = 2u;  // table cos/sin fp32

class RmsNormRopeFamily : public Family {
 public:
  static constexpr std::int64_t kMaxWidth = 32768;
  static constexpr int kMaxElementsPerThread = 64;  // of q and k together, as floats
  static constexpr float kDefaultEps = 1e-5f;

  Op op() const override { return Op::rms_norm_rope; }
  std::string_view header() const override { return "kiln/rms_norm_rope.cuh"; }

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
};

}  // namespace kiln
