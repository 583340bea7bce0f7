#include <doctest/doctest.h>

#include <string>

#include "jit/compiler.h"
#include "jit/l2_flush.h"
#include "jit/nvrtc.h"
#include "jit_test_support.h"

namespace kiln::jit {

using test::contains;

namespace {

std::string ptx_for(int sm) {
  NvrtcProgram program(l2_flush_source(), "l2_flush_test.cu", {});
  Expected<NvrtcOutput> out = program.compile(compile_options(sm, BinaryFormat::cubin), true);
  REQUIRE_MESSAGE(out.ok(), (out.ok() ? "" : out.error().what()));
  CHECK(out->cubin.size() > 4);
  return {out->ptx.begin(), out->ptx.end()};
}

}  // namespace

TEST_CASE("the L2 flush's read evicts last on sm_80 and sm_90, and compiles plainly for sm_75") {
  for (int sm : {80, 90}) {
    CAPTURE(sm);
    const std::string ptx = ptx_for(sm);
    CHECK(contains(ptx, ".entry kiln_l2_scrub"));
    CHECK(contains(ptx, "createpolicy.fractional.L2::evict_last.b64"));
    CHECK(contains(ptx, "ld.global.L2::cache_hint.v4.u32"));
  }
  const std::string older = ptx_for(75);
  CHECK(contains(older, ".entry kiln_l2_scrub"));
  CHECK_FALSE(contains(older, "createpolicy"));
  CHECK(contains(older, "ld.global.v4.u32"));
}

TEST_CASE(
    "the L2 flush lowers lines to evict_normal on sm_80 and sm_90, and does nothing on sm_75") {
  for (int sm : {80, 90}) {
    CAPTURE(sm);
    const std::string ptx = ptx_for(sm);
    CHECK(contains(ptx, ".entry kiln_l2_lower"));
    CHECK(contains(ptx, "applypriority.global.L2::evict_normal"));
  }
  const std::string older = ptx_for(75);
  CHECK(contains(older, ".entry kiln_l2_lower"));
  CHECK_FALSE(contains(older, "applypriority"));
}

TEST_CASE("the lowering kernel's parameter struct holds kL2LowerRegions regions, as the host's") {
  // Eight bytes an address and eight a line count per region, then the count (padded to 8):
  // the layout of L2Flush's LowerParams, which the launch copies byte for byte.
  const std::string expected =
      "kiln_l2_lower_param_0[" + std::to_string(16 * kL2LowerRegions + 8) + "]";
  for (int sm : {75, 90}) {
    CAPTURE(sm);
    CHECK(contains(ptx_for(sm), expected));
  }
}

}  // namespace kiln::jit
