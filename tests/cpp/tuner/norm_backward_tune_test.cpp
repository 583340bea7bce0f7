#include <doctest/doctest.h>

#include "fakes.h"
#include "templates/family.h"
#include "templates/norm_backward_family.h"
#include "tuner/tuner.h"

using kiln::DType;
using kiln::Op;
using kiln::Problem;

TEST_CASE("the norm backward's partial sums tune through the fast and the full search") {
  for (int sm : {75, 80, 90}) {
    const kiln::DeviceTraits device = kiln::DeviceTraits::for_arch(sm);
    for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
      for (std::int64_t hidden : {std::int64_t{768}, std::int64_t{1024}, std::int64_t{4098}}) {
        const Problem sums{Op::rms_norm_backward, dtype, hidden, kiln::kNormSumPartials, 16};
        for (std::int64_t rows : {std::int64_t{2}, std::int64_t{256}, std::int64_t{1024}}) {
          for (kiln::TuneMode mode : {kiln::TuneMode::fast, kiln::TuneMode::full}) {
            CAPTURE(sums.key());
            CAPTURE(rows);
            kiln::testing::FakeEvaluator evaluator;
            const kiln::TuneResult result =
                kiln::tune(kiln::family(sums.op), sums, rows, device, mode, evaluator);
            CHECK(evaluator.calls >= 1);
            CHECK(kiln::family(sums.op).invalid_reason(sums, result.winner, device).empty());
          }
        }
      }
    }
  }
}
