#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "cache/error.h"
#include "templates/activation_backward_family.h"
#include "templates/family.h"
#include "templates/kiln/activation_backward_params.cuh"

using kiln::ActivationBackwardFamily;
using kiln::Config;
using kiln::DeviceTraits;
using kiln::DType;
using kiln::Op;
using kiln::Problem;

namespace {

constexpr Op kOps[] = {Op::swiglu_backward, Op::geglu_backward, Op::gelu_backward,
                       Op::clamped_swiglu_backward};
constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16};
constexpr std::int64_t kWidths[] = {1, 7, 768, 1000, 4545, 8192, 14336};
constexpr int kArchs[] = {75, 80, 90};

// Every flag combination the op accepts.
std::vector<std::uint32_t> flag_sets(Op op) {
  const auto& f = static_cast<const ActivationBackwardFamily&>(kiln::family(op));
  std::vector<std::uint32_t> sets;
  for (std::uint32_t flags = 0; flags < 256; ++flags) {
    if ((flags & ~f.allowed_flags()) != 0) continue;
    if ((flags & kiln::kElementwiseFlat) != 0 && (flags & kiln::kGeluHasBias) != 0) continue;
    sets.push_back(flags);
  }
  return sets;
}

}  // namespace

TEST_CASE("the registry serves the activation backward family for its four ops") {
  for (Op op : kOps) {
    const kiln::Family& f = kiln::family(op);
    CHECK(f.op() == op);
    CHECK(f.header() == "kiln/activation_backward.cuh");
    CHECK(kiln::parse_op(kiln::op_name(op)) == op);
  }
  CHECK(kiln::op_name(Op::gelu_backward) == "gelu_backward");
  CHECK(flag_sets(Op::swiglu_backward).size() == 2);
  CHECK(flag_sets(Op::geglu_backward).size() == 4);
  CHECK(flag_sets(Op::gelu_backward).size() == 6);
  CHECK(flag_sets(Op::clamped_swiglu_backward).size() == 4);
}

TEST_CASE("clamped_swiglu's backward reads and writes interleaved pairs in place of two halves") {
  const kiln::Family& f = kiln::family(Op::clamped_swiglu_backward);
  const Problem pairs{Op::clamped_swiglu_backward, DType::bf16, 2880,
                      kiln::kPackedInterleaved | kiln::kElementwiseFlat, 16};
  CHECK(f.name_expression(pairs, f.heuristic(pairs, DeviceTraits::for_arch(90))) ==
        "kiln::activation_backward<kiln::bf16, 2880, 16, 256, 1, true, "
        "kiln::ClampedSiluMulBackward<true>>");
  const auto specs = f.buffers(pairs, 10);
  REQUIRE(specs.size() == 3);
  CHECK(specs[0].name == "gate_up");
  CHECK(specs[0].elements == 10 * 2 * 2880);
  CHECK(specs[1].name == "dy");
  CHECK(specs[2].is_output);
  CHECK(specs[2].elements == 10 * 2 * 2880);
  CHECK(f.bytes_moved(pairs, 10) == 5 * 10 * 2880 * 2);
  const std::uint64_t addresses[] = {0x1000, 0x2000, 0x3000};
  kiln::ActivationBackwardParams p;
  std::memcpy(&p, f.pack_params(pairs, 10, addresses).data(), sizeof(p));
  CHECK(p.a == reinterpret_cast<const void*>(0x1000));
  CHECK(p.dy == reinterpret_cast<const void*>(0x2000));
  CHECK(p.out0 == reinterpret_cast<void*>(0x3000));
  CHECK(p.b == nullptr);
  CHECK(p.out1 == nullptr);
  CHECK(p.a_row_stride == 2 * 2880);
  CHECK(p.out0_row_stride == 2 * 2880);
  CHECK(p.dy_row_stride == 2880);
  CHECK(p.alpha == kiln::kClampedSwigluAlpha);
  CHECK(p.limit == kiln::kClampedSwigluLimit);
  // The halves: swiglu_backward's five buffers.
  CHECK(f.buffers(Problem{Op::clamped_swiglu_backward, DType::bf16, 2880, 0u, 16}, 10).size() == 5);
}

TEST_CASE("activation backward refuses problems it cannot specialise") {
  const kiln::Family& gelu = kiln::family(Op::gelu_backward);
  CHECK_NOTHROW(gelu.check(Problem{Op::gelu_backward, DType::bf16, 8, kiln::kGeluHasBias, 16}));
  CHECK_THROWS_WITH_AS(
      gelu.check(Problem{Op::gelu_backward, DType::bf16, 8,
                         kiln::kGeluHasBias | kiln::kElementwiseFlat, 16}),
      "kiln.gelu_backward: flags: expected no flat layout with a bias (a sum over rows), got 5",
      kiln::ArgumentError);
  CHECK_THROWS_AS(kiln::family(Op::swiglu_backward)
                      .check(Problem{Op::swiglu_backward, DType::bf16, 8, kiln::kGeluErf, 16}),
                  kiln::ArgumentError);
  CHECK_THROWS_AS(gelu.check(Problem{Op::gelu_backward, DType::bf16, 0, 0u, 16}),
                  kiln::ArgumentError);
  CHECK_THROWS_AS(gelu.check(Problem{Op::gelu, DType::bf16, 8, 0u, 16}), kiln::ArgumentError);
}

TEST_CASE("every backward problem has a valid heuristic inside a non-empty space") {
  for (int sm : kArchs) {
    const DeviceTraits device = DeviceTraits::for_arch(sm);
    for (Op op : kOps) {
      const kiln::Family& f = kiln::family(op);
      for (DType dtype : kDTypes) {
        for (std::int64_t width : kWidths) {
          for (std::uint32_t flags : flag_sets(op)) {
            for (std::uint32_t align : {16u, 2u}) {
              const Problem p{op, dtype, width, flags, align};
              CAPTURE(p.key());
              const std::vector<Config> space = f.space(p, device);
              REQUIRE_FALSE(space.empty());
              const Config h = f.heuristic(p, device);
              CHECK(f.invalid_reason(p, h, device).empty());
              CHECK(std::find(space.begin(), space.end(), h) != space.end());
              for (const Config& c : space) {
                // Every access is a whole number of elements no wider than the data allows.
                CHECK(c.vec_bytes >= static_cast<int>(kiln::dtype_size(dtype)));
                CHECK(c.vec_bytes <= std::max<int>(align, kiln::dtype_size(dtype)));
                if ((flags & kiln::kElementwiseFlat) == 0) {
                  CHECK((width * static_cast<std::int64_t>(kiln::dtype_size(dtype))) %
                            c.vec_bytes ==
                        0);
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("the bias reduction has its own tunables and a 2-D grid of row groups") {
  const DeviceTraits h100 = DeviceTraits::for_arch(90);
  const kiln::Family& f = kiln::family(Op::gelu_backward);
  const Problem biased{Op::gelu_backward, DType::bf16, 3072, kiln::kGeluHasBias, 16};
  const Config h = f.heuristic(biased, h100);
  CHECK(h.vec_bytes == 16);
  CHECK(h.cta_threads == 256);  // 384 vectors of 8 a row: the widest heuristic CTA
  CHECK(h.extra.count("max_ctas") == 0);
  CHECK(f.name_expression(biased, h) ==
        "kiln::bias_gelu_backward<kiln::bf16, 3072, 16, 256, 2, false>");
  const kiln::LaunchGeometry g = f.geometry(biased, h, 4096);
  CHECK(g.grid[0] == 2);    // 384 vectors in tiles of 256
  CHECK(g.grid[1] == 256);  // 4096 rows in groups of 16
  CHECK(g.block[0] == 256);
  Config with_max = h;
  with_max.extra["max_ctas"] = 0;
  CHECK(f.invalid_reason(biased, with_max, h100).find("no tunable named 'max_ctas'") !=
        std::string::npos);
  // A CTA twice as wide as a row's vectors is refused (half of it would idle).
  const Problem narrow{Op::gelu_backward, DType::f32, 256, kiln::kGeluHasBias, 16};
  Config wide = f.heuristic(narrow, h100);
  CHECK(wide.cta_threads == 64);
  wide.cta_threads = 128;
  CHECK_FALSE(f.invalid_reason(narrow, wide, h100).empty());
}

TEST_CASE("row groups depend on the row count only: about 16 rows each, 64 to 512 groups") {
  CHECK(ActivationBackwardFamily::row_groups(0) == 1);
  CHECK(ActivationBackwardFamily::row_groups(1) == 1);
  CHECK(ActivationBackwardFamily::row_groups(5) == 5);
  CHECK(ActivationBackwardFamily::row_groups(300) == 64);
  CHECK(ActivationBackwardFamily::row_groups(2000) == 125);
  CHECK(ActivationBackwardFamily::row_groups(4096) == 256);
  CHECK(ActivationBackwardFamily::row_groups(1 << 20) == 512);
}

TEST_CASE("the elementwise backward pass is named, sized and packed in buffers() order") {
  const DeviceTraits h100 = DeviceTraits::for_arch(90);
  const kiln::Family& swiglu = kiln::family(Op::swiglu_backward);
  const Problem flat{Op::swiglu_backward, DType::bf16, 14336, kiln::kElementwiseFlat, 16};
  const Config h = swiglu.heuristic(flat, h100);
  CHECK(swiglu.name_expression(flat, h) ==
        "kiln::activation_backward<kiln::bf16, 14336, 16, 256, 1, true, kiln::SiluMulBackward>");
  const Problem erf{Op::geglu_backward, DType::f16, 4545, kiln::kGeluErf, 2};
  CHECK(kiln::family(Op::geglu_backward)
            .name_expression(erf, kiln::family(Op::geglu_backward).heuristic(erf, h100)) ==
        "kiln::activation_backward<kiln::f16, 4545, 2, 256, 1, false, "
        "kiln::GeluMulBackward<true>>");

  const auto specs = swiglu.buffers(flat, 10);
  REQUIRE(specs.size() == 5);
  CHECK(specs[2].name == "dy");
  CHECK(specs[3].is_output);
  CHECK(specs[4].is_output);
  CHECK(swiglu.bytes_moved(flat, 10) == 5 * 10 * 14336 * 2);
  const std::uint64_t addresses[] = {0x1000, 0x2000, 0x3000, 0x4000, 0x5000};
  const auto bytes = swiglu.pack_params(flat, 10, addresses);
  REQUIRE(bytes.size() == sizeof(kiln::ActivationBackwardParams));
  kiln::ActivationBackwardParams p;
  std::memcpy(&p, bytes.data(), sizeof(p));
  CHECK(p.a == reinterpret_cast<const void*>(0x1000));
  CHECK(p.b == reinterpret_cast<const void*>(0x2000));
  CHECK(p.dy == reinterpret_cast<const void*>(0x3000));
  CHECK(p.out0 == reinterpret_cast<void*>(0x4000));
  CHECK(p.out1 == reinterpret_cast<void*>(0x5000));
  CHECK(p.partials == nullptr);
  CHECK(p.rows == 10);
  CHECK(p.out1_row_stride == 14336);
  CHECK_THROWS_AS(swiglu.pack_params(flat, 10, std::span(addresses, 4)), kiln::Error);
}

TEST_CASE("gelu backward with a bias writes fp32 partial sums, one row per row group") {
  const kiln::Family& f = kiln::family(Op::gelu_backward);
  const Problem biased{Op::gelu_backward, DType::bf16, 1000, kiln::kGeluHasBias, 16};
  const auto specs = f.buffers(biased, 300);
  REQUIRE(specs.size() == 5);
  CHECK(specs[1].elements == 1000);  // the bias: one row
  CHECK(specs[4].name == "partials");
  CHECK(specs[4].dtype == DType::f32);
  CHECK(specs[4].elements == 64 * 1000);
  CHECK(specs[4].is_output);
  CHECK(f.bytes_moved(biased, 300) == (3 * 300 * 1000 + 1000) * 2 + 64 * 1000 * 4);
  const std::uint64_t addresses[] = {0x1000, 0x2000, 0x3000, 0x4000, 0x5000};
  kiln::ActivationBackwardParams p;
  const auto bytes = f.pack_params(biased, 300, addresses);
  std::memcpy(&p, bytes.data(), sizeof(p));
  CHECK(p.b == reinterpret_cast<const void*>(0x2000));
  CHECK(p.b_row_stride == 0);
  CHECK(p.partials == reinterpret_cast<float*>(0x5000));
  const Problem plain{Op::gelu_backward, DType::bf16, 1000, 0u, 16};
  REQUIRE(f.buffers(plain, 300).size() == 3);
  CHECK(f.bytes_moved(plain, 300) == 3 * 300 * 1000 * 2);
}
