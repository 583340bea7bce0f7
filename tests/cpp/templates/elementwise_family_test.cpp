#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "cache/error.h"
#include "templates/elementwise_family.h"
#include "templates/family.h"
#include "templates/kiln/elementwise_params.cuh"

using kiln::Config;
using kiln::DeviceTraits;
using kiln::DType;
using kiln::Op;
using kiln::Problem;

namespace {

constexpr Op kOps[] = {Op::swiglu, Op::geglu, Op::gelu, Op::gated_residual, Op::clamped_swiglu};
constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16};
constexpr std::int64_t kWidths[] = {1, 7, 768, 4545, 8192, 8960, 11008, 14336, 18944, 28672};
constexpr int kArchs[] = {75, 80, 90};

Problem problem(Op op, DType dtype, std::int64_t hidden, std::uint32_t flags = 0,
                std::uint32_t align = 16) {
  return Problem{op, dtype, hidden, flags, align};
}

// Every flag combination the op accepts.
std::vector<std::uint32_t> flag_sets(Op op) {
  const auto& f = static_cast<const kiln::ElementwiseFamily&>(kiln::family(op));
  std::vector<std::uint32_t> sets;
  for (std::uint32_t flags = 0; flags < 256; ++flags) {
    if ((flags & ~f.allowed_flags()) != 0) {
      continue;
    }
    const bool flat = (flags & kiln::kElementwiseFlat) != 0;
    if (flat && (flags & (kiln::kGeluHasBias | kiln::kGatePerSample | kiln::kGateShared)) != 0) {
      continue;
    }
    if ((flags & kiln::kGatePerSample) != 0 && (flags & kiln::kGateShared) != 0) {
      continue;
    }
    sets.push_back(flags);
  }
  return sets;
}

Config config(int vec, int cta, std::int64_t unroll, std::int64_t max_ctas) {
  Config c;
  c.vec_bytes = vec;
  c.threads_per_row = 1;
  c.cta_threads = cta;
  c.extra["unroll"] = unroll;
  c.extra["max_ctas"] = max_ctas;
  return c;
}

}  // namespace

TEST_CASE("the registry serves one elementwise family per activation op") {
  const auto all = kiln::families();
  for (Op op : kOps) {
    const kiln::Family& f = kiln::family(op);
    CHECK(f.op() == op);
    CHECK(f.header() == "kiln/elementwise.cuh");
    CHECK(std::count(all.begin(), all.end(), &f) == 1);
  }
  CHECK(kiln::family(Op::swiglu).name() == "swiglu");
  CHECK(kiln::family(Op::gated_residual).name() == "gated_residual");
  CHECK_THROWS_AS(kiln::ElementwiseFamily(Op::rms_norm), kiln::Error);
}

TEST_CASE("check rejects what cannot be specialised") {
  const kiln::Family& swiglu = kiln::family(Op::swiglu);
  const kiln::Family& gelu = kiln::family(Op::gelu);
  CHECK_NOTHROW(swiglu.check(problem(Op::swiglu, DType::bf16, 1)));
  CHECK_THROWS_WITH_AS(swiglu.check(problem(Op::swiglu, DType::bf16, 0)),
                       "kiln.swiglu: hidden: expected a row width in [1, 16777216], got 0",
                       kiln::ArgumentError);
  CHECK_THROWS_AS(swiglu.check(problem(Op::gelu, DType::bf16, 8)), kiln::ArgumentError);
  CHECK_THROWS_WITH_AS(swiglu.check(problem(Op::swiglu, DType::bf16, 8, kiln::kGeluErf)),
                       doctest::Contains("flags"), kiln::ArgumentError);
  CHECK_THROWS_AS(swiglu.check(problem(Op::swiglu, DType::bf16, 8, 0, 3)), kiln::ArgumentError);
  // A broadcast operand has no flat layout.
  CHECK_THROWS_WITH_AS(
      gelu.check(problem(Op::gelu, DType::bf16, 8, kiln::kElementwiseFlat | kiln::kGeluHasBias)),
      doctest::Contains("broadcast"), kiln::ArgumentError);
  CHECK_THROWS_AS(kiln::family(Op::gated_residual)
                      .check(problem(Op::gated_residual, DType::bf16, 8,
                                     kiln::kElementwiseFlat | kiln::kGatePerSample)),
                  kiln::ArgumentError);
  CHECK_THROWS_WITH_AS(kiln::family(Op::gated_residual)
                           .check(problem(Op::gated_residual, DType::bf16, 8,
                                          kiln::kElementwiseFlat | kiln::kGateShared)),
                       doctest::Contains("shared gate"), kiln::ArgumentError);
  CHECK_THROWS_WITH_AS(kiln::family(Op::gated_residual)
                           .check(problem(Op::gated_residual, DType::bf16, 8,
                                          kiln::kGatePerSample | kiln::kGateShared)),
                       "kiln.gated_residual: flags: expected a gate per sample (8) or shared by "
                       "every row (64), not both, got 72",
                       kiln::ArgumentError);
  CHECK_THROWS_AS(swiglu.check(problem(Op::swiglu, DType::bf16, 8, kiln::kGateShared)),
                  kiln::ArgumentError);
}

TEST_CASE("space is non-empty and valid, and holds the heuristic, for every problem class") {
  for (int sm : kArchs) {
    const DeviceTraits device = DeviceTraits::for_arch(sm);
    for (Op op : kOps) {
      const kiln::Family& f = kiln::family(op);
      for (DType dtype : kDTypes) {
        for (std::int64_t width : kWidths) {
          for (std::uint32_t flags : flag_sets(op)) {
            for (std::uint32_t align : {16u, 4u, 2u}) {
              const Problem p = problem(op, dtype, width, flags, align);
              CAPTURE(p.key());
              CAPTURE(sm);
              const std::vector<Config> space = f.space(p, device);
              REQUIRE_FALSE(space.empty());
              std::set<std::string> keys;
              for (const Config& c : space) {
                CAPTURE(c.key());
                CHECK(f.invalid_reason(p, c, device) == "");
                CHECK(keys.insert(c.key()).second);
                CHECK(c.threads_per_row == 1);
                CHECK(c.vec_bytes == space.front().vec_bytes);
              }
              const Config h = f.heuristic(p, device);
              CHECK(std::find(space.begin(), space.end(), h) != space.end());
            }
          }
        }
      }
    }
  }
}

TEST_CASE("the vector is the widest the alignment and the layout allow") {
  const kiln::Family& f = kiln::family(Op::swiglu);
  const DeviceTraits h100 = DeviceTraits::for_arch(90);
  auto vec = [&](const Problem& p) { return f.heuristic(p, h100).vec_bytes; };
  CHECK(vec(problem(Op::swiglu, DType::bf16, 14336)) == 16);
  CHECK(vec(problem(Op::swiglu, DType::f32, 14336)) == 16);
  // Rows of 4545 bf16 are not whole 16-, 8- or 4-byte vectors; flat, the width does not matter.
  CHECK(vec(problem(Op::swiglu, DType::bf16, 4545)) == 2);
  CHECK(vec(problem(Op::swiglu, DType::bf16, 4545, kiln::kElementwiseFlat)) == 16);
  CHECK(vec(problem(Op::swiglu, DType::bf16, 4546)) == 4);
  CHECK(vec(problem(Op::swiglu, DType::bf16, 4096, 0, 8)) == 8);
  // An fp32 element is 4-byte aligned whatever smaller alignment was reported.
  CHECK(vec(problem(Op::swiglu, DType::f32, 4096, 0, 2)) == 4);
}

TEST_CASE("invalid_reason explains each broken rule") {
  const kiln::Family& f = kiln::family(Op::gated_residual);
  const DeviceTraits h100 = DeviceTraits::for_arch(90);
  const Problem p = problem(Op::gated_residual, DType::bf16, 4096);
  const std::int64_t wave = kiln::ElementwiseFamily::wave_ctas(h100, 256);
  CHECK(wave == 132 * 8);
  CHECK(f.invalid_reason(p, config(16, 256, 2, 0), h100) == "");
  CHECK(f.invalid_reason(p, config(16, 256, 2, wave), h100) == "");
  CHECK(f.invalid_reason(p, config(8, 256, 2, 0), h100).find("widest") != std::string::npos);
  CHECK(f.invalid_reason(p, config(16, 96, 2, 0), h100).find("cta_threads 96") == 0);
  // CTAs of 32 and 64 threads spread calls smaller than one wave: one vector per thread, a
  // grid covering the data.
  CHECK(f.invalid_reason(p, config(16, 32, 1, 0), h100) == "");
  CHECK(f.invalid_reason(p, config(16, 64, 1, 0), h100) == "");
  CHECK(f.invalid_reason(p, config(16, 64, 2, 0), h100).find("unroll 1 and max_ctas 0") !=
        std::string::npos);
  CHECK(f.invalid_reason(p, config(16, 32, 1, kiln::ElementwiseFamily::wave_ctas(h100, 32)), h100)
            .find("unroll 1 and max_ctas 0") != std::string::npos);
  CHECK(f.invalid_reason(p, config(16, 256, 3, 0), h100).find("unroll 3") == 0);
  CHECK(f.invalid_reason(p, config(16, 256, 2, 7), h100).find("max_ctas 7") == 0);
  // 3 operands x 8 steps x 4 words is too much for the 64 registers of a 1024-thread CTA.
  CHECK(f.invalid_reason(p, config(16, 1024, 8, 0), h100).find("registers") != std::string::npos);
  Config split = config(16, 256, 2, 0);
  split.threads_per_row = 32;
  CHECK(f.invalid_reason(p, split, h100).find("threads_per_row") == 0);
  Config unknown = config(16, 256, 2, 0);
  unknown.extra["cluster"] = 2;
  CHECK(f.invalid_reason(p, unknown, h100).find("cluster") != std::string::npos);
  DeviceTraits small = h100;
  small.max_threads_per_block = 512;
  CHECK(f.invalid_reason(p, config(16, 1024, 1, 0), small).find("512 threads per block") !=
        std::string::npos);
}

TEST_CASE("name_expression spells the kernel and its op") {
  const Config c = config(16, 256, 2, 0);
  CHECK(kiln::family(Op::swiglu)
            .name_expression(problem(Op::swiglu, DType::bf16, 14336, kiln::kElementwiseFlat), c) ==
        "kiln::elementwise<kiln::bf16, 14336, 16, 256, 2, true, false, kiln::SiluMul>");
  CHECK(kiln::family(Op::geglu).name_expression(
            problem(Op::geglu, DType::f16, 8192, kiln::kGeluErf), c) ==
        "kiln::elementwise<kiln::f16, 8192, 16, 256, 2, false, false, kiln::GeluMul<true>>");
  CHECK(kiln::family(Op::gelu).name_expression(
            problem(Op::gelu, DType::f32, 3072, kiln::kGeluHasBias), config(16, 128, 4, 0)) ==
        "kiln::elementwise<float, 3072, 16, 128, 4, false, false, kiln::BiasGelu<false, true>>");
  CHECK(kiln::family(Op::gated_residual)
            .name_expression(problem(Op::gated_residual, DType::bf16, 2048,
                                     kiln::kGatePerSample | kiln::kGatedResidualInPlace),
                             c) ==
        "kiln::elementwise<kiln::bf16, 2048, 16, 256, 2, false, false, kiln::GatedResidual<true, "
        "true>>");
  CHECK(
      kiln::family(Op::swiglu)
          .name_expression(problem(Op::swiglu, DType::bf16, 8192, kiln::kElementwiseIndex64), c) ==
      "kiln::elementwise<kiln::bf16, 8192, 16, 256, 2, false, true, kiln::SiluMul>");
}

TEST_CASE("geometry covers every vector once, or caps the grid at one wave") {
  const kiln::Family& f = kiln::family(Op::swiglu);
  const DeviceTraits h100 = DeviceTraits::for_arch(90);
  for (const Problem& p : {problem(Op::swiglu, DType::bf16, 14336),
                           problem(Op::swiglu, DType::bf16, 4545, kiln::kElementwiseFlat),
                           problem(Op::swiglu, DType::f32, 7)}) {
    for (const Config& c : f.space(p, h100)) {
      for (std::int64_t rows : {1, 7, 128, 4096, 16384}) {
        CAPTURE(c.key());
        CAPTURE(rows);
        const kiln::LaunchGeometry g = f.geometry(p, c, rows);
        const std::int64_t unroll = c.extra.at("unroll");
        const std::int64_t max_ctas = c.extra.at("max_ctas");
        const std::int64_t vectors = kiln::ElementwiseFamily::vectors(p, c.vec_bytes, rows);
        const std::int64_t per_cta = c.cta_threads * unroll;
        CHECK(g.block[0] == static_cast<std::uint32_t>(c.cta_threads));
        const std::int64_t grid = g.grid[0];
        CHECK(grid >= 1);
        if (max_ctas == 0 || (vectors + per_cta - 1) / per_cta <= max_ctas) {
          CHECK(grid * per_cta >= vectors);
          CHECK((grid - 1) * per_cta < std::max<std::int64_t>(vectors, 1));
        } else {
          CHECK(grid == max_ctas);
        }
      }
    }
  }
  // Flat: rows * width elements in whole vectors, the partial last one done apart.
  CHECK(kiln::ElementwiseFamily::vectors(
            problem(Op::swiglu, DType::bf16, 4545, kiln::kElementwiseFlat), 16, 3) == 3 * 4545 / 8);
  CHECK(kiln::ElementwiseFamily::vectors(problem(Op::swiglu, DType::bf16, 4096), 16, 3) == 3 * 512);
}

TEST_CASE("calls past 2^31 elements index in 64 bits, and no 32-bit launch can wrap") {
  using kiln::ElementwiseFamily;
  const std::int64_t first_wide = (std::int64_t{1} << 31) - (std::int64_t{1} << 25);
  CHECK_FALSE(ElementwiseFamily::needs_index64(0));
  CHECK_FALSE(ElementwiseFamily::needs_index64(first_wide - 1));
  CHECK(ElementwiseFamily::needs_index64(first_wide));
  CHECK(ElementwiseFamily::needs_index64(std::int64_t{1} << 40));

  const kiln::Family& f = kiln::family(Op::gelu);
  const DeviceTraits h100 = DeviceTraits::for_arch(90);
  // An odd width: rows of 2-byte vectors (one element each, the most vectors a call can
  // have), or flat 16-byte ones.
  const std::int64_t width = 4545;
  const std::int64_t narrow_rows = (first_wide - 1) / width;
  for (std::uint32_t extra : {0u, kiln::kElementwiseFlat}) {
    const Problem narrow = problem(Op::gelu, DType::bf16, width, extra);
    const Problem wide = problem(Op::gelu, DType::bf16, width, extra | kiln::kElementwiseIndex64);
    for (const Config& c : f.space(narrow, h100)) {
      CAPTURE(c.key());
      // Just enough rows for 2^32 vectors.
      const std::int64_t wide_rows = (std::int64_t{1} << 32) * (c.vec_bytes / 2) / width + 1;
      CHECK_NOTHROW(f.geometry(narrow, c, narrow_rows));
      CHECK_THROWS_WITH_AS(f.geometry(narrow, c, wide_rows), doctest::Contains("64-bit index"),
                           kiln::Error);
      CHECK_NOTHROW(f.geometry(wide, c, wide_rows));
    }
  }
}

TEST_CASE("buffers, bytes_moved and pack_params describe a stand-alone run") {
  const std::int64_t rows = 10;
  const auto swiglu = kiln::family(Op::swiglu).buffers(problem(Op::swiglu, DType::bf16, 64), rows);
  REQUIRE(swiglu.size() == 3);
  CHECK(swiglu[0].name == "gate");
  CHECK(swiglu[1].name == "up");
  CHECK(swiglu[2].is_output);
  CHECK(kiln::family(Op::swiglu).bytes_moved(problem(Op::swiglu, DType::bf16, 64), rows) ==
        3 * rows * 64 * 2);

  const Problem bias = problem(Op::gelu, DType::f32, 64, kiln::kGeluHasBias);
  const auto gelu = kiln::family(Op::gelu).buffers(bias, rows);
  REQUIRE(gelu.size() == 3);
  CHECK(gelu[1].name == "bias");
  CHECK(gelu[1].elements == 64);
  CHECK(kiln::family(Op::gelu).bytes_moved(bias, rows) == (2 * rows * 64 + 64) * 4);
  CHECK(kiln::family(Op::gelu).buffers(problem(Op::gelu, DType::f32, 64), rows).size() == 2);

  const Problem per_sample = problem(Op::gated_residual, DType::bf16, 64, kiln::kGatePerSample);
  const auto gr = kiln::family(Op::gated_residual).buffers(per_sample, 600);
  REQUIRE(gr.size() == 4);
  CHECK(gr[2].name == "gate");
  CHECK(gr[2].elements == 3 * 64);  // ceil(600 / 256) samples

  const std::uint64_t addresses[] = {0x1000, 0x2000, 0x3000, 0x4000};
  const std::vector<std::byte> bytes =
      kiln::family(Op::gated_residual).pack_params(per_sample, 600, addresses);
  REQUIRE(bytes.size() == sizeof(kiln::ElementwiseParams));
  kiln::ElementwiseParams params;
  std::memcpy(&params, bytes.data(), sizeof(params));
  CHECK(reinterpret_cast<std::uintptr_t>(params.a) == 0x1000);
  CHECK(reinterpret_cast<std::uintptr_t>(params.b) == 0x2000);
  CHECK(reinterpret_cast<std::uintptr_t>(params.c) == 0x3000);
  CHECK(reinterpret_cast<std::uintptr_t>(params.out) == 0x4000);
  CHECK(params.rows == 600);
  // Rows 255, 256 and 599 belong to samples 0, 1 and 2.
  CHECK(kiln::quotient(255ull, params.rows_per_sample) == 0);
  CHECK(kiln::quotient(256ull, params.rows_per_sample) == 1);
  CHECK(kiln::quotient(599ull, params.rows_per_sample) == 2);
  CHECK(params.c_row_stride == 64);

  // A shared gate is one row, read by every row (stride 0): three streams, as its calls move.
  const Problem shared = problem(Op::gated_residual, DType::bf16, 64, kiln::kGateShared);
  const auto one_gate = kiln::family(Op::gated_residual).buffers(shared, 600);
  REQUIRE(one_gate.size() == 4);
  CHECK(one_gate[2].elements == 64);
  CHECK(kiln::family(Op::gated_residual).bytes_moved(shared, 600) == (3 * 600 + 1) * 64 * 2);
  std::memcpy(&params, kiln::family(Op::gated_residual).pack_params(shared, 600, addresses).data(),
              sizeof(params));
  CHECK(params.c_row_stride == 0);
  CHECK(params.a_row_stride == 64);
  CHECK(kiln::quotient(599ull, params.rows_per_sample) == 599);
  // The same kernel as a per-token gate's: the flag only shapes the stand-alone run.
  CHECK(kiln::family(Op::gated_residual)
            .name_expression(
                shared,
                kiln::family(Op::gated_residual).heuristic(shared, DeviceTraits::for_arch(90))) ==
        kiln::family(Op::gated_residual)
            .name_expression(problem(Op::gated_residual, DType::bf16, 64),
                             kiln::family(Op::gated_residual)
                                 .heuristic(problem(Op::gated_residual, DType::bf16, 64),
                                            DeviceTraits::for_arch(90))));
  const Problem per_token = problem(Op::gated_residual, DType::bf16, 64);
  CHECK(kiln::family(Op::gated_residual).buffers(per_token, 600)[2].elements == 600 * 64);

  const std::uint64_t two[] = {0x1000, 0x2000, 0x3000};
  std::memcpy(&params, kiln::family(Op::gelu).pack_params(bias, 5, two).data(), sizeof(params));
  CHECK(params.b_row_stride == 0);  // the bias is one row for all
  CHECK(params.c == nullptr);
  CHECK_THROWS_AS(kiln::family(Op::gelu).pack_params(bias, 5, addresses), kiln::Error);
}

TEST_CASE("clamped_swiglu reads one packed row of interleaved pairs, or its halves") {
  const kiln::Family& f = kiln::family(Op::clamped_swiglu);
  const Problem pairs = problem(Op::clamped_swiglu, DType::bf16, 2880, kiln::kPackedInterleaved);
  const auto buffers = f.buffers(pairs, 10);
  REQUIRE(buffers.size() == 2);
  CHECK(buffers[0].name == "gate_up");
  CHECK(buffers[0].elements == 10 * 2 * 2880);
  CHECK(buffers[1].is_output);
  CHECK(buffers[1].elements == 10 * 2880);
  CHECK(f.bytes_moved(pairs, 10) == 3 * 10 * 2880 * 2);

  const std::uint64_t two[] = {0x1000, 0x9000};
  kiln::ElementwiseParams params;
  std::memcpy(&params, f.pack_params(pairs, 10, two).data(), sizeof(params));
  CHECK(reinterpret_cast<std::uintptr_t>(params.a) == 0x1000);
  CHECK(params.b == nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(params.out) == 0x9000);
  CHECK(params.a_row_stride == 2 * 2880);  // a packed row holds both of an output row's inputs
  CHECK(params.out_row_stride == 2880);
  CHECK(params.alpha == kiln::kClampedSwigluAlpha);
  CHECK(params.limit == kiln::kClampedSwigluLimit);
  const std::uint64_t three[] = {0x1000, 0x2000, 0x9000};
  CHECK_THROWS_AS(f.pack_params(pairs, 10, three), kiln::Error);

  // The halves: gate and up as two operands, as swiglu's packed form.
  const Problem halves = problem(Op::clamped_swiglu, DType::bf16, 2880);
  CHECK(f.buffers(halves, 10).size() == 3);
  std::memcpy(&params, f.pack_params(halves, 10, three).data(), sizeof(params));
  CHECK(reinterpret_cast<std::uintptr_t>(params.b) == 0x2000);
  CHECK(params.a_row_stride == 2880);

  const Config heuristic = f.heuristic(pairs, DeviceTraits::for_arch(90));
  CHECK(f.name_expression(pairs, heuristic) ==
        "kiln::elementwise<kiln::bf16, 2880, 16, 256, 1, false, false, "
        "kiln::ClampedSiluMul<true>>");
  CHECK(f.name_expression(halves, heuristic).ends_with("kiln::ClampedSiluMul<false>>"));
  // Interleaving is clamped_swiglu's alone.
  CHECK_THROWS_AS(kiln::family(Op::swiglu)
                      .check(problem(Op::swiglu, DType::bf16, 64, kiln::kPackedInterleaved)),
                  kiln::ArgumentError);
}

TEST_CASE("common problems are valid and cover both layouts") {
  for (Op op : kOps) {
    const kiln::Family& f = kiln::family(op);
    const auto problems = f.common_problems(DType::bf16, 14336, kiln::PrewarmModel{});
    CHECK(problems.size() >= 2);
    for (const Problem& p : problems) {
      CHECK_NOTHROW(f.check(p));
    }
  }
  // DiT blocks at batch 1 (FLUX, Wan) gate with one shared row: prewarm compiles that problem.
  const auto gated =
      kiln::family(Op::gated_residual).common_problems(DType::bf16, 3072, kiln::PrewarmModel{});
  CHECK(std::count_if(gated.begin(), gated.end(),
                      [](const Problem& p) { return p.flags == kiln::kGateShared; }) == 1);
  // LTX-Video's per-token gates are views of [B, T, 2, D], rows apart: not flat, in place or not.
  for (std::uint32_t flags : {0u, kiln::kGatedResidualInPlace}) {
    CHECK(std::count_if(gated.begin(), gated.end(),
                        [&](const Problem& p) { return p.flags == flags; }) == 1);
  }
  // FLUX's single blocks write the activation into a slice of a wider buffer: not flat.
  const auto gelu =
      kiln::family(Op::gelu).common_problems(DType::bf16, 12288, kiln::PrewarmModel{});
  CHECK(std::count_if(gelu.begin(), gelu.end(), [](const Problem& p) { return p.flags == 0; }) ==
        1);
}
