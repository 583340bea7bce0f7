#include <string>

#include "cache/error.h"
#include "templates/activation_backward_family.h"
#include "templates/elementwise_family.h"
#include "templates/family.h"
#include "templates/norm_backward_family.h"
#include "templates/norm_family.h"
#include "templates/rms_norm_family.h"
#include "templates/rms_norm_rope_family.h"
#include "templates/rope_family.h"

namespace kiln {
namespace {

const RmsNormFamily kRmsNorm;
const NormFamily kFusedAddRmsNorm(Op::fused_add_rms_norm);
const NormFamily kLayerNorm(Op::layer_norm);
const NormFamily kAdaLn(Op::adaln);
const NormFamily kGatedAdaLn(Op::gated_adaln);
const NormFamily kRmsNormGated(Op::rms_norm_gated);
const RopeFamily kRope(Op::rope);
const RopeFamily kRope3d(Op::rope_3d);
const RmsNormRopeFamily kRmsNormRope;

const ElementwiseFamily kSwiglu{Op::swiglu};
const ElementwiseFamily kGeglu{Op::geglu};
const ElementwiseFamily kGelu{Op::gelu};
const ElementwiseFamily kGatedResidual{Op::gated_residual};
const ActivationBackwardFamily kSwigluBackward{Op::swiglu_backward};
const ActivationBackwardFamily kGegluBackward{Op::geglu_backward};
const ActivationBackwardFamily kGeluBackward{Op::gelu_backward};
const ElementwiseFamily kClampedSwiglu{Op::clamped_swiglu};
const ActivationBackwardFamily kClampedSwigluBackward{Op::clamped_swiglu_backward};

const NormBackwardFamily kRmsNormBackward(Op::rms_norm_backward);
const NormBackwardFamily kFusedAddRmsNormBackward(Op::fused_add_rms_norm_backward);
const NormBackwardFamily kLayerNormBackward(Op::layer_norm_backward);
const NormBackwardFamily kAdaLnBackward(Op::adaln_backward);

// Every op has exactly one family; the list is short, so lookup is a scan.
constexpr const Family* kFamilies[] = {
    // clang-format off
    &kRmsNorm, &kFusedAddRmsNorm, &kLayerNorm, &kAdaLn,  &kGatedAdaLn,  &kSwiglu, &kGeglu,
    &kGelu,    &kGatedResidual,   &kRope,      &kRope3d, &kRmsNormRope,
    &kRmsNormBackward,
    &kFusedAddRmsNormBackward,
    &kLayerNormBackward,
    &kAdaLnBackward,
    &kSwigluBackward,
    &kGegluBackward,
    &kGeluBackward,
    &kRmsNormGated,
    &kClampedSwiglu,
    &kClampedSwigluBackward,
    // clang-format on
};

}  // namespace

const Family& family(Op op) {
  for (const Family* f : kFamilies) {
    if (f->op() == op) {
      return *f;
    }
  }
  throw Error("kiln: no op family registered for op " + std::string(op_name(op)));
}

std::span<const Family* const> families() {
  return kFamilies;
}

}  // namespace kiln
