// The RMSNorm family: kiln::norm (templates/kiln/norm.cuh) with neither residual, gate nor
// modulation, so plain RMSNorm gets every tunable of the norm kernel (exact warp splits,
// persistent prefetching grids) and one kernel serves the whole norm family.
#pragma once

#include <cstdint>

#include "templates/norm_family.h"

namespace kiln {

// Problem::flags bit of rms_norm (the norm family's weight bit).
inline constexpr std::uint32_t kRmsNormHasWeight = kNormWeight;

class RmsNormFamily : public NormFamily {
 public:
  RmsNormFamily() : NormFamily(Op::rms_norm) {}
};

}  // namespace kiln
