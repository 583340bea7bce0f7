// The RMSNorm family: kiln::rms_norm in templates/kiln/rms_norm.cuh.
//
// A row of `hidden` elements is split among threads_per_row threads, each holding its part
// of the row in registers (loaded once with vec_bytes-wide accesses); a CTA of cta_threads
// threads handles cta_threads / threads_per_row rows at a time and strides over the grid.
#pragma once

#include <cstdint>

#include "templates/family.h"

namespace kiln {

// Problem::flags bits of rms_norm.
inline constexpr std::uint32_t kRmsNormHasWeight = 1u;

class RmsNormFamily : public Family {
 public:
  static constexpr std::int64_t kMaxHidden = 65536;
  // The most row elements one thread may hold in registers (its fp32 copy of the row).
  static constexpr int kMaxElementsPerThread = 64;
  // The eps pack_params uses for a stand-alone run (the bindings pass the caller's).
  static constexpr float kDefaultEps = 1e-6f;

  Op op() const override { return Op::rms_norm; }
  std::string_view header() const override { return "kiln/rms_norm.cuh"; }

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
  // With and without a weight (diffusers' q/k norms and DiT blocks have none).
  std::vector<Problem> common_problems(DType dtype, std::int64_t hidden) const override;

  // Row elements each thread holds under `config`: its vectors, tail included.
  static std::int64_t elements_per_thread(const Problem& problem, const Config& config);
};

}  // namespace kiln
