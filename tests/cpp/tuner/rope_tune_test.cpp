#include <doctest/doctest.h>

#include "fakes.h"
#include "templates/family.h"
#include "templates/rms_norm_rope_family.h"
#include "templates/rope_family.h"
#include "tuner/tuner.h"

using kiln::DType;
using kiln::Op;
using kiln::Problem;

TEST_CASE("the RoPE families tune through the fast search") {
  const kiln::DeviceTraits device = kiln::DeviceTraits::for_arch(90);
  Problem rope{Op::rope, DType::bf16, 128, 0u, 16};
  Problem video{Op::rope_3d, DType::bf16, 2048, 0u, 16};
  Problem fused{Op::rms_norm_rope, DType::bf16, 2048, kiln::kRmsNormRopeVideo, 16};
  for (const Problem& p : {rope, video, fused}) {
    for (std::int64_t rows : {std::int64_t{40}, std::int64_t{1031}, std::int64_t{64512}}) {
      kiln::testing::FakeEvaluator evaluator;
      const kiln::TuneResult result =
          kiln::tune(kiln::family(p.op), p, rows, device, kiln::TuneMode::fast, evaluator);
      CHECK((evaluator.calls == 1 || evaluator.calls == 2));
      CHECK(kiln::family(p.op).invalid_reason(p, result.winner, device).empty());
    }
  }
}
