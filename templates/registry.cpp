#include <string>

#include "cache/error.h"
#include "templates/family.h"
#include "templates/rms_norm_family.h"
#include "templates/rms_norm_rope_family.h"
#include "templates/rope_family.h"

namespace kiln {
namespace {

const RmsNormFamily kRmsNorm;
const RopeFamily kRope(Op::rope);
const RopeFamily kRope3d(Op::rope_3d);
const RmsNormRopeFamily kRmsNormRope;

// Every op has exactly one family; the list is short, so lookup is a scan. One line each.
constexpr const Family* kFamilies[] = {
    &kRmsNorm,
    &kRope,
    &kRope3d,
    &kRmsNormRope,
};

}  // namespace

const Family& family(Op op) {
  for (const Family* f : kFamilies) {
    if (f->op() == op) return *f;
  }
  throw Error("kiln: no op family registered for op " + std::string(op_name(op)));
}

std::span<const Family* const> families() {
  return kFamilies;
}

}  // namespace kiln
