// What `kiln prewarm` compiles for an op: every family's common problems carry the alignment a
// model's calls of whole allocations in contiguous rows have (the host takes every operand's row
// stride into it), so that a width whose rows are not whole 16-byte multiples is found by its
// first call, and each has kernels to compile on every target.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "templates/activation_backward_family.h"
#include "templates/config_rules.h"
#include "templates/elementwise_family.h"
#include "templates/family.h"
#include "templates/norm_backward_family.h"

namespace kiln {
namespace {

// Rows back to back, whose alignment only the allocations' addresses make, and the norm
// backward's sums of partial rows, which the host always calls at 16.
bool whole_allocations(const Family& fam, const Problem& problem) {
  const bool elementwise = dynamic_cast<const ElementwiseFamily*>(&fam) != nullptr ||
                           dynamic_cast<const ActivationBackwardFamily*>(&fam) != nullptr;
  const bool norm_backward = dynamic_cast<const NormBackwardFamily*>(&fam) != nullptr;
  return (elementwise && (problem.flags & kElementwiseFlat) != 0) ||
         (norm_backward && (problem.flags & kNormSumPartials) != 0);
}

bool rotates_pairs(Op op) {
  return op == Op::rope || op == Op::rope_3d || op == Op::rms_norm_rope;
}

}  // namespace

TEST_CASE("prewarm compiles each family's problems at the alignment of the model's calls") {
  for (const Family* fam : families()) {
    for (const DType dtype : {DType::bf16, DType::f32}) {
      // 16-byte rows; 8-, 4- and 2-byte multiples of bf16 (fp32: 16, 8, 4).
      for (const std::int64_t hidden : {4096, 4100, 4098, 4097}) {
        if (hidden % 2 != 0 && rotates_pairs(fam->op())) {
          continue;
        }
        const auto row = hidden * static_cast<std::int64_t>(dtype_size(dtype));
        for (const Problem& problem : fam->common_problems(dtype, hidden, PrewarmModel{})) {
          CAPTURE(problem.key());
          CHECK(problem.align == (whole_allocations(*fam, problem) ? 16u : row_alignment({row})));
          CHECK_NOTHROW(fam->check(problem));
          for (const int arch : {75, 80, 90}) {
            CHECK(!fam->space(problem, DeviceTraits::for_arch(arch)).empty());
          }
        }
      }
    }
  }
}

TEST_CASE("a row's alignment is the largest power of two to 16 that divides every row") {
  CHECK(row_alignment({8192}) == 16);
  CHECK(row_alignment({8192, 156}) == 4);  // MiniMax-M3-VL's [S, 78] bf16 tables
  CHECK(row_alignment({72}) == 8);
  CHECK(row_alignment({8194}) == 2);
  CHECK(row_alignment({4097}) == 1);
}

}  // namespace kiln
