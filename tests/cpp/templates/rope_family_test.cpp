#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <span>
#include <string>

#include "cache/error.h"
#include "templates/family.h"
#include "templates/kiln/rope_params.cuh"
#include "templates/rms_norm_rope_family.h"
#include "templates/rope_family.h"
#include "templates/rope_video.h"

using kiln::Config;
using kiln::DeviceTraits;
using kiln::DType;
using kiln::Op;
using kiln::Problem;

namespace {

Problem rope(DType dtype, std::int64_t d, std::uint32_t flags = 0, std::int64_t aux = 0,
             std::uint32_t align = 16) {
  Problem p{Op::rope, dtype, d, flags, align};
  p.aux = aux;
  return p;
}

std::int64_t element(const Problem& p) {
  return static_cast<std::int64_t>(kiln::dtype_size(p.dtype));
}

}  // namespace

TEST_CASE("the registry serves one family per RoPE op") {
  for (Op op : {Op::rope, Op::rope_3d, Op::rms_norm_rope}) {
    CHECK(kiln::family(op).op() == op);
  }
  CHECK(kiln::family(Op::rope).header() == "kiln/rope.cuh");
  CHECK(kiln::family(Op::rope_3d).header() == "kiln/rope.cuh");
  CHECK(kiln::family(Op::rms_norm_rope).header() == "kiln/rms_norm_rope.cuh");
}

TEST_CASE("rope refuses problems it cannot specialise") {
  const kiln::Family& f = kiln::family(Op::rope);
  CHECK_NOTHROW(f.check(rope(DType::bf16, 128)));
  CHECK_THROWS_WITH_AS(f.check(rope(DType::bf16, 63)),
                       "kiln.rope: q: expected an even head dim in [2, 16384], got 63",
                       kiln::ArgumentError);
  CHECK_THROWS_AS(f.check(rope(DType::bf16, 128, 0, 130)), kiln::ArgumentError);
  CHECK_THROWS_AS(f.check(rope(DType::bf16, 128, 0, 33)), kiln::ArgumentError);
  CHECK_NOTHROW(f.check(rope(DType::bf16, 128, kiln::kRopePositionsInner)));
  CHECK_THROWS_AS(f.check(rope(DType::bf16, 128, 1024)), kiln::ArgumentError);
  CHECK_NOTHROW(f.check(rope(DType::bf16, 128, kiln::kRopeHeadNorm)));
  CHECK_NOTHROW(f.check(rope(DType::bf16, 128, kiln::kRopeHalfTable)));
  CHECK_THROWS_AS(kiln::family(Op::rope_3d)
                      .check(Problem{Op::rope_3d, DType::bf16, 2048, kiln::kRopeHalfTable, 16}),
                  kiln::ArgumentError);
  CHECK_NOTHROW(f.check(rope(DType::bf16, 2048, kiln::kRopeOneHeadEach)));
  CHECK_THROWS_WITH_AS(
      f.check(rope(DType::bf16, 128, kiln::kRopeOneHeadEach | kiln::kRopeHeadsEven)),
      "kiln.rope: flags: expected one-head-each (64) without heads-even (16), "
      "got 80",
      kiln::ArgumentError);
  CHECK_NOTHROW(f.check(rope(DType::bf16, 128, kiln::kRopeHeadsEven | kiln::kRopeHeadsBy4)));
  CHECK_THROWS_WITH_AS(f.check(rope(DType::bf16, 128, kiln::kRopeHeadsBy4)),
                       "kiln.rope: flags: expected heads-by-4 (32) together with heads-even "
                       "(16), got 32",
                       kiln::ArgumentError);
  Problem video{Op::rope_3d, DType::bf16, 2048, kiln::kRopeInterleaved, 16};
  CHECK_THROWS_AS(kiln::family(Op::rope_3d).check(video), kiln::ArgumentError);
}

TEST_CASE("every config of the rope space keeps whole rotation units in one thread") {
  const DeviceTraits device = DeviceTraits::for_arch(90);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (std::int64_t d : {2, 64, 80, 96, 128, 256, 2048}) {
      for (std::uint32_t flags : {0u, kiln::kRopeInterleaved, kiln::kRopeTableF32}) {
        for (std::int64_t aux : {std::int64_t{0}, d / 2}) {
          if (aux % 2 != 0 || (aux != 0 && aux < 2)) continue;
          const Problem p = rope(dtype, d, flags, aux);
          const auto configs = kiln::family(Op::rope).space(p, device);
          const std::int64_t rd = aux == 0 ? d : aux;
          const bool interleaved = (flags & kiln::kRopeInterleaved) != 0;
          for (const Config& c : configs) {
            const std::int64_t vec = c.vec_bytes / element(p);
            CHECK(c.vec_bytes >= element(p));
            CHECK(rd % (interleaved ? vec : 2 * vec) == 0);
            CHECK((d - rd) % vec == 0);
            if (interleaved) CHECK(vec % 2 == 0);
            CHECK(c.cta_threads % c.threads_per_row == 0);
          }
          if (d >= 4 || !interleaved) {
            REQUIRE_FALSE(configs.empty());
            const Config h = kiln::family(Op::rope).heuristic(p, device);
            CHECK(kiln::family(Op::rope).invalid_reason(p, h, device).empty());
          }
        }
      }
    }
  }
}

TEST_CASE("the rope heuristic gives a head one rotation unit a thread, rounding up") {
  const DeviceTraits device = DeviceTraits::for_arch(90);
  const auto& f = kiln::family(Op::rope);
  const std::uint32_t heads = kiln::kRopeHeadsEven | kiln::kRopeHeadsBy4;
  // (head dim, rotary dim, alignment) -> (vector bytes, threads a row): 5 units of 16 bytes a
  // half for 80, 9 of 8 bytes for 72 (a 16-byte vector would straddle its half), 6 for 96.
  struct Expected {
    std::int64_t d, aux, align;
    int vec, tpr;
  };
  for (const Expected& e :
       {Expected{80, 0, 16, 16, 8}, Expected{72, 0, 16, 8, 16}, Expected{96, 0, 16, 16, 8},
        Expected{128, 96, 16, 16, 8}, Expected{128, 0, 16, 16, 8}, Expected{64, 0, 16, 16, 4}}) {
    CAPTURE(e.d);
    CAPTURE(e.aux);
    const Problem p = rope(DType::bf16, e.d, heads | kiln::kRopeTableF32, e.aux, e.align);
    const Config h = f.heuristic(p, device);
    CHECK(h.vec_bytes == e.vec);
    CHECK(h.threads_per_row == e.tpr);
    CHECK(kiln::RopeFamily::rows_per_thread(h) == 2);
    CHECK(h.cta_threads == 128);
    CHECK(f.invalid_reason(p, h, device).empty());
  }
  // Longer rows keep the power of two below: 39 units (MiniMax-M3-VL's 78 rotated columns of 80
  // in 2-byte vectors) take 32 threads; LTX-Video's 2048-wide interleaved rows, 256 units, two
  // units a thread.
  const Problem minimax = rope(DType::bf16, 80, heads, 78);
  CHECK(f.heuristic(minimax, device).threads_per_row == 32);
  const Config video =
      kiln::family(Op::rope_3d).heuristic(Problem{Op::rope_3d, DType::bf16, 2048, 0, 16}, device);
  CHECK(video.threads_per_row == 128);
}

TEST_CASE("the rope heuristic gives a 128-wide bf16 head eight threads of 16-byte vectors") {
  const DeviceTraits device = DeviceTraits::for_arch(90);
  const Config h = kiln::family(Op::rope).heuristic(rope(DType::bf16, 128), device);
  CHECK(h.vec_bytes == 16);
  CHECK(h.threads_per_row == 8);
  CHECK(kiln::RopeFamily::rows_per_thread(h) == 2);
  CHECK(kiln::family(Op::rope).name_expression(rope(DType::bf16, 128), h) ==
        "kiln::rope<kiln::bf16, kiln::bf16, 128, 128, 16, 8, 128, 2, false, false, false, false, "
        "0>");
  const Config narrow = kiln::family(Op::rope).heuristic(rope(DType::bf16, 128, 0, 0, 4), device);
  CHECK(narrow.vec_bytes == 4);
}

TEST_CASE("rope packs its stand-alone run and counts its bytes") {
  const kiln::Family& f = kiln::family(Op::rope);
  const Problem p = rope(DType::bf16, 128, kiln::kRopeTableF32);
  const auto specs = f.buffers(p, 64);  // 8 tokens x (6 + 2) heads
  REQUIRE(specs.size() == 6);
  CHECK(specs[0].elements == 8 * 6 * 128);
  CHECK(specs[1].elements == 8 * 2 * 128);
  CHECK(specs[2].dtype == DType::f32);
  CHECK(specs[2].elements == 8 * 128);
  CHECK(specs[4].is_output);
  const std::uint64_t addresses[] = {0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000};
  const auto bytes = f.pack_params(p, 64, addresses);
  kiln::RopeParams params;
  REQUIRE(bytes.size() == sizeof(params));
  std::memcpy(&params, bytes.data(), sizeof(params));
  CHECK(params.rows == 64);
  CHECK(params.heads_q == 6);
  CHECK(params.heads_k == 2);
  CHECK(params.q_strides[1] == 6 * 128);
  CHECK(params.cos_strides[1] == 128);
  CHECK(f.bytes_moved(p, 64) == 2 * 64 * 128 * 2 + 2 * 8 * 128 * 4);
  // Odd row counts (the evaluator's verification rows) become one q head per token.
  CHECK(f.buffers(p, 1031)[0].elements == 1031 * 128);
  // ...and their k_out, never written, is not an output the evaluator checks for NaN.
  CHECK_FALSE(f.buffers(p, 1031)[5].is_output);
  CHECK(f.buffers(p, 64)[5].is_output);
}

TEST_CASE("head-count flags decide how a thread finds its rows") {
  using kiln::kRopeHeadsBy4;
  using kiln::kRopeHeadsEven;
  using kiln::kRopeOneHeadEach;
  CHECK(kiln::rope_head_flags(32, 8) == (kRopeHeadsEven | kRopeHeadsBy4));
  CHECK(kiln::rope_head_flags(24, 24) == (kRopeHeadsEven | kRopeHeadsBy4));
  CHECK(kiln::rope_head_flags(12, 2) == kRopeHeadsEven);
  CHECK(kiln::rope_head_flags(8, 1) == 0u);
  CHECK(kiln::rope_head_flags(1, 2) == 0u);
  CHECK(kiln::rope_head_flags(1, 1) == kRopeOneHeadEach);
  const kiln::Family& f = kiln::family(Op::rope);
  const DeviceTraits device = DeviceTraits::for_arch(90);
  for (std::uint32_t heads :
       {0u, kRopeHeadsEven, kRopeHeadsEven | kRopeHeadsBy4, kRopeOneHeadEach}) {
    const Problem p = rope(DType::bf16, 128, kiln::kRopePositionsInner | heads);
    // Flags change which kernel a config compiles to, never the space.
    CHECK(f.space(p, device) == f.space(rope(DType::bf16, 128, kiln::kRopePositionsInner), device));
    for (const Config& c : f.space(p, device)) {
      const int rows = kiln::RopeFamily::rows_per_thread(c);
      const bool even = (heads & kRopeHeadsEven) != 0;
      const kiln::RopeForm form =
          rows == 1 || (rows == 2 && even) || (rows == 4 && (heads & kRopeHeadsBy4) != 0)
              ? kiln::kRopeGrouped
          : rows == 2 && heads == kRopeOneHeadEach ? kiln::kRopeTokenPair
                                                   : kiln::kRopeGeneral;
      CAPTURE(c.key());
      CHECK(kiln::RopeFamily::form(p, c) == form);
      CHECK(f.name_expression(p, c).ends_with(", " + std::to_string(int{form}) + ">"));
    }
  }
  // rope_3d's calls have one head each, flag or not: two rows a thread are a token's q and k.
  const kiln::Family& video = kiln::family(Op::rope_3d);
  const Problem v{Op::rope_3d, DType::bf16, 2048, 0u, 16};
  for (const Config& c : video.space(v, device)) {
    const int rows = kiln::RopeFamily::rows_per_thread(c);
    CAPTURE(c.key());
    CHECK(kiln::RopeFamily::form(v, c) == (rows == 1   ? kiln::kRopeGrouped
                                           : rows == 2 ? kiln::kRopeTokenPair
                                                       : kiln::kRopeGeneral));
  }
}

TEST_CASE("rope's common problems take the model's head counts, and training their inverse") {
  const kiln::Family& f = kiln::family(Op::rope);
  const auto flags_of = [&](const kiln::PrewarmModel& model) {
    std::vector<std::uint32_t> flags;
    for (const Problem& p : f.common_problems(DType::bf16, 128, model)) {
      CHECK(p.op == Op::rope);
      CHECK(p.hidden == 128);
      flags.push_back(p.flags);
    }
    return flags;
  };
  using kiln::kRopeInterleaved;
  using kiln::kRopeInverse;
  using kiln::kRopePositionsInner;
  using kiln::kRopeTableF32;
  const std::uint32_t by4 = kiln::rope_head_flags(4, 4);
  // Unknown counts are fours: the four layouts, forward only. transformers' attentions hand
  // over q and k heads inner ([B, S, H, D] memory viewed as [B, H, S, D]): no flag.
  CHECK(flags_of({}) == std::vector<std::uint32_t>{
                            by4, kRopePositionsInner | by4, kRopeInterleaved | kRopeTableF32 | by4,
                            kRopeInterleaved | kRopeTableF32 | kRopePositionsInner | by4});
  // Llama-3-8B's 32 and 8 heads, training: each layout then its inverse rotation.
  const std::uint32_t gqa = kiln::rope_head_flags(32, 8);
  const std::uint32_t inner = kRopePositionsInner | gqa;
  const std::uint32_t interleaved = kRopeInterleaved | kRopeTableF32 | gqa;
  CHECK(flags_of({32, 8, true}) ==
        std::vector<std::uint32_t>{gqa, gqa | kRopeInverse, inner, inner | kRopeInverse,
                                   interleaved, interleaved | kRopeInverse,
                                   interleaved | kRopePositionsInner,
                                   interleaved | kRopePositionsInner | kRopeInverse});
  // Gemma's 8 and 1 heads: counts that are not both even carry no head flag.
  for (std::uint32_t flags : flags_of({8, 1, false})) {
    CHECK((flags & kiln::kRopeHeadCountFlags) == 0u);
  }
  // FLUX's 24 + 24 heads, normalised and rotated in one call: its table layout also with the
  // head norm; training adds the inverses alone (the fused op has no backward).
  const std::uint32_t flux = kRopeInterleaved | kRopeTableF32 | kiln::rope_head_flags(24, 24);
  const std::uint32_t flux_layout = kRopeInterleaved | kRopeTableF32;
  const auto flux_flags = flags_of({24, 24, false, flux_layout});
  CHECK(flux_flags == std::vector<std::uint32_t>{by4, kRopePositionsInner | by4, flux,
                                                 flux | kiln::kRopeHeadNorm,
                                                 flux | kRopePositionsInner});
  // Qwen3-8B's 32 and 8 heads: halves and a bf16 table, q and k as its projections hand them
  // over (no layout flag).
  CHECK(flags_of({32, 8, false, 0u}) ==
        std::vector<std::uint32_t>{gqa, gqa | kiln::kRopeHeadNorm, inner, interleaved,
                                   interleaved | kRopePositionsInner});
  for (std::uint32_t flags : flags_of({24, 24, true, flux_layout})) {
    CHECK((flags & (kiln::kRopeHeadNorm | kRopeInverse)) != (kiln::kRopeHeadNorm | kRopeInverse));
  }
  // rope_3d takes no flags: one problem whatever the model.
  const auto video = kiln::family(Op::rope_3d).common_problems(DType::bf16, 64, {24, 24, true});
  REQUIRE(video.size() == 1);
  CHECK(video[0].flags == 0u);
}

TEST_CASE("a flagged problem's stand-alone run keeps its head counts") {
  const kiln::Family& f = kiln::family(Op::rope);
  const std::uint64_t addresses[] = {0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000};
  kiln::RopeParams params;
  const Problem by4 = rope(DType::bf16, 128, kiln::rope_head_flags(4, 4));
  // The evaluator's odd verification rows: as many whole tokens of a model's 24 + 8 heads as
  // they hold, so a table row serves as many rows as in a model's call.
  std::memcpy(&params, f.pack_params(by4, 1031, addresses).data(), sizeof(params));
  CHECK(params.heads_q == 24);
  CHECK(params.heads_k == 8);
  CHECK(params.rows == 1024);
  CHECK(f.buffers(by4, 1031)[0].elements == 32 * 24 * 128);
  CHECK(f.buffers(by4, 1031)[2].elements == 32 * 128);  // cos: one row a token
  CHECK(f.buffers(by4, 1031)[5].is_output);
  CHECK(f.bytes_moved(by4, 64) == 2 * 64 * 128 * 2 + 2 * 2 * 128 * 2);
  // Fewer rows than a token of those: the fewest heads that keep the flags.
  std::memcpy(&params, f.pack_params(by4, 20, addresses).data(), sizeof(params));
  CHECK(params.heads_q == 4);
  CHECK(params.heads_k == 4);
  CHECK(params.rows == 16);
  // Fewer rows than a token of both: q's heads alone.
  std::memcpy(&params, f.pack_params(by4, 4, addresses).data(), sizeof(params));
  CHECK(params.heads_q == 4);
  CHECK(params.heads_k == 0);
  CHECK(params.rows == 4);
  CHECK_FALSE(f.buffers(by4, 4)[5].is_output);
  const Problem even = rope(DType::bf16, 128, kiln::rope_head_flags(2, 6));
  std::memcpy(&params, f.pack_params(even, 265, addresses).data(), sizeof(params));
  CHECK(params.heads_q == 12);
  CHECK(params.heads_k == 2);
  CHECK(params.rows == 252);
  std::memcpy(&params, f.pack_params(even, 13, addresses).data(), sizeof(params));
  CHECK(params.heads_q == 2);
  CHECK(params.heads_k == 2);
  CHECK(params.rows == 12);
  // One head each: whole tokens of q and k, and a lone row is q's.
  for (const Problem& pair : {rope(DType::bf16, 2048, kiln::rope_head_flags(1, 1)),
                              Problem{Op::rope_3d, DType::bf16, 2048, 0u, 16}}) {
    const kiln::Family& family = kiln::family(pair.op);
    const auto used = std::span(addresses).first(pair.op == Op::rope ? 6 : 4);
    std::memcpy(&params, family.pack_params(pair, 1031, used).data(), sizeof(params));
    CHECK(params.heads_q == 1);
    CHECK(params.heads_k == 1);
    CHECK(params.rows == 1030);
    std::memcpy(&params, family.pack_params(pair, 1, used).data(), sizeof(params));
    CHECK(params.heads_q == 1);
    CHECK(params.heads_k == 0);
    CHECK(params.rows == 1);
  }
}

TEST_CASE("rope's positions-inner stand-alone run lays q and k out [heads, tokens, D]") {
  const kiln::Family& f = kiln::family(Op::rope);
  const Problem p = rope(DType::bf16, 128, kiln::kRopePositionsInner);
  const std::uint64_t addresses[] = {0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000};
  const auto bytes = f.pack_params(p, 64, addresses);  // 8 tokens x (6 + 2) heads
  kiln::RopeParams params;
  REQUIRE(bytes.size() == sizeof(params));
  std::memcpy(&params, bytes.data(), sizeof(params));
  CHECK(params.positions_inner == 1);
  CHECK(params.q_strides[1] == 128);      // position
  CHECK(params.q_strides[2] == 8 * 128);  // head
  CHECK(params.k_strides[2] == 8 * 128);
  CHECK(params.q_out_strides[2] == 8 * 128);
  // Same buffers, bytes and kernels as the heads-inner layout: only the walk differs.
  const Problem heads_inner = rope(DType::bf16, 128);
  CHECK(f.bytes_moved(p, 64) == f.bytes_moved(heads_inner, 64));
  CHECK(f.buffers(p, 64).size() == f.buffers(heads_inner, 64).size());
  const DeviceTraits device = DeviceTraits::for_arch(90);
  const Config h = f.heuristic(p, device);
  CHECK(f.name_expression(p, h) == f.name_expression(heads_inner, h));
  CHECK(p.key() != heads_inner.key());
  std::memcpy(&params, f.pack_params(heads_inner, 64, addresses).data(), sizeof(params));
  CHECK(params.positions_inner == 0);
  CHECK(params.q_strides[1] == 6 * 128);
}

namespace {

// What the kernels compute from the params' magics, against plain division.
void check_quotients(const kiln::Divisor& magic, unsigned divisor) {
  CAPTURE(divisor);
  for (unsigned n :
       {0u, 1u, divisor - 1, divisor, divisor + 1, 7u * divisor + 3, 1000003u, (1u << 31) - 1}) {
    CHECK(kiln::quotient(n, magic) == n / divisor);
  }
}

}  // namespace

TEST_CASE("set_row_order gives the kernel tokens, seq and their magics") {
  kiln::RopeParams params{};
  // An odd sequence length; heads of 128 bf16 elements (256 bytes).
  kiln::set_row_order(params, 2LL * 77 * (24 + 8), 2, 24, 8, true, 256);
  CHECK(params.rows == 2 * 77 * 32);
  CHECK(params.batch == 2);
  CHECK(params.heads_q == 24);
  CHECK(params.heads_k == 8);
  CHECK(params.positions_inner == 1);
  CHECK(params.tokens == 2 * 77);
  CHECK(params.seq == 77);
  check_quotients(params.heads_divisor, 32);
  check_quotients(params.batch_divisor, 2);
  check_quotients(params.seq_divisor, 77);
  // The grouped form's panels: 1 MB of a head's rows, here more than all 154 tokens.
  CHECK(params.panel_tokens == 154);
  CHECK(params.last_panel_tokens == 154);
  CHECK(kiln::rope_panel_tokens(256, 1 << 20) == 4096);
  CHECK(kiln::rope_panel_tokens(384, 1 << 20) == 2048);
  kiln::set_row_order(params, 2LL * 4607 * 48, 2, 24, 24, true, 256);
  CHECK(params.panel_tokens == 4096);
  CHECK(params.last_panel_tokens == 2 * 4607 - 2 * 4096);
  check_quotients(params.panel_divisor, 4096);
  check_quotients(params.last_panel_divisor, 2 * 4607 - 2 * 4096);
  // pack_params fills them for the stand-alone run: one sample of 8 tokens x (6 + 2) heads.
  const kiln::Family& f = kiln::family(Op::rope);
  const std::uint64_t addresses[] = {0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000};
  std::memcpy(&params, f.pack_params(rope(DType::bf16, 128), 64, addresses).data(), sizeof(params));
  CHECK(params.tokens == 8);
  CHECK(params.seq == 8);
  check_quotients(params.heads_divisor, 8);
  check_quotients(params.seq_divisor, 8);
}

TEST_CASE("rms_norm_rope's sequence length comes with its magic") {
  kiln::RmsNormRopeParams params{};
  kiln::set_seq_len(params, 2688);
  CHECK(params.seq_len == 2688);
  check_quotients(params.seq_len_divisor, 2688);
}

TEST_CASE("video grids follow LTXVideoRotaryPosEmbed") {
  kiln::VideoRopeSettings s;
  const kiln::RopeVideoGrid g = kiln::make_video_grid("rope_3d", 2048, s);
  CHECK(g.pad_pairs == 1);  // 2048 % 6 = 2 lanes
  CHECK(g.scale[0] == doctest::Approx(0.32 / 20));
  CHECK(g.scale[1] == doctest::Approx(32.0 / 2048));
  CHECK(g.log2_freq_step == doctest::Approx(std::log2(10000.0) / 340));
  check_quotients(g.width_divisor, static_cast<unsigned>(g.width));
  check_quotients(g.height_divisor, static_cast<unsigned>(g.height));
  s.interpolation_scale.reset();
  CHECK(kiln::make_video_grid("rope_3d", 96, s).scale[2] == 1.0f);
  CHECK_THROWS_AS(kiln::make_video_grid("rope_3d", 4, s), kiln::ArgumentError);
}

TEST_CASE("rms_norm_rope vectors always hold whole pairs") {
  const DeviceTraits device = DeviceTraits::for_arch(80);
  const kiln::Family& f = kiln::family(Op::rms_norm_rope);
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (std::int64_t w : {6, 96, 2048, 3072}) {
      const Problem p{Op::rms_norm_rope, dtype, w, kiln::kRmsNormRopeVideo, 16};
      const auto configs = f.space(p, device);
      REQUIRE_FALSE(configs.empty());
      for (const Config& c : configs) {
        CHECK((c.vec_bytes / element(p)) % 2 == 0);
        CHECK((w * element(p)) % c.vec_bytes == 0);
      }
    }
  }
  const Problem both{Op::rms_norm_rope, DType::bf16, 2048,
                     kiln::kRmsNormRopeVideo | kiln::kRmsNormRopeTableF32, 16};
  CHECK_THROWS_AS(f.check(both), kiln::ArgumentError);
}

TEST_CASE("rms_norm_rope with a table of each head's pairs (aux = head dim)") {
  const DeviceTraits device = DeviceTraits::for_arch(90);
  const kiln::Family& f = kiln::family(Op::rms_norm_rope);
  // Vectors stay inside one head: 12 bf16 take 4 or 8 bytes, never 16.
  const Problem wan_small{Op::rms_norm_rope, DType::bf16, 72, 0u, 16, 12};
  const auto configs = f.space(wan_small, device);
  REQUIRE_FALSE(configs.empty());
  for (const Config& c : configs) CHECK(12 * 2 % c.vec_bytes == 0);
  Config sixteen = configs.front();
  sixteen.vec_bytes = 16;
  CHECK(f.invalid_reason(wan_small, sixteen, device) ==
        "vec_bytes 16 would straddle two heads of 12 elements");
  // The head dim reaches the kernel's name; the table is head_dim / 2 angles a token.
  const Problem wan{Op::rms_norm_rope, DType::bf16, 5120, kiln::kRmsNormRopeTableF32, 16, 128};
  const Config c = f.heuristic(wan, device);
  CHECK(f.name_expression(wan, c).ends_with(", 128>"));
  const Problem ltx{Op::rms_norm_rope, DType::bf16, 5120, kiln::kRmsNormRopeTableF32, 16};
  const std::string ltx_name = f.name_expression(ltx, c);
  CHECK(f.name_expression(wan, c) == ltx_name.substr(0, ltx_name.size() - 1) + ", 128>");
  const auto specs = f.buffers(wan, 10);
  CHECK(specs[4].name == "cos");
  CHECK(specs[4].elements == 10 * 64);
  CHECK(f.bytes_moved(wan, 10) == (4 * 10 + 2) * 5120 * 2 + 2 * 10 * 64 * 4);
  // A head dim not in fours, one that does not divide the row, or a head dim with coordinates.
  for (const Problem& bad :
       {Problem{Op::rms_norm_rope, DType::bf16, 5120, 0u, 16, 127},
        Problem{Op::rms_norm_rope, DType::bf16, 5120, 0u, 16, 96},
        Problem{Op::rms_norm_rope, DType::bf16, 5120, kiln::kRmsNormRopeVideo, 16, 128}}) {
    CHECK_THROWS_WITH_AS(f.check(bad),
                         doctest::Contains("a head dim in multiples of 4 dividing the width 5120"),
                         kiln::ArgumentError);
  }
}

TEST_CASE("rms_norm_rope takes fewer than 2^31 tokens (the kernel divides in 32 bits)") {
  const kiln::Family& f = kiln::family(Op::rms_norm_rope);
  const Problem p{Op::rms_norm_rope, DType::bf16, 2048, kiln::kRmsNormRopeVideo, 16};
  const std::int64_t largest = (std::int64_t{1} << 31) - 1;
  CHECK_NOTHROW(f.buffers(p, largest));
  CHECK_THROWS_WITH_AS(f.buffers(p, largest + 1),
                       doctest::Contains("expected a count in [0, 2^31), got 2147483648"),
                       kiln::ArgumentError);
}

TEST_CASE("rope's inverse (backward) is a flag compiled into the kernel, same space and bytes") {
  const DeviceTraits device = DeviceTraits::for_arch(80);
  const kiln::Family& f = kiln::family(Op::rope);
  for (std::uint32_t flags : {0u, kiln::kRopeInterleaved | kiln::kRopeTableF32}) {
    const Problem forward = rope(DType::bf16, 128, flags, 64);
    const Problem inverse = rope(DType::bf16, 128, flags | kiln::kRopeInverse, 64);
    CHECK_NOTHROW(f.check(inverse));
    CHECK(f.space(inverse, device) == f.space(forward, device));
    const Config h = f.heuristic(inverse, device);
    CHECK(h == f.heuristic(forward, device));
    CHECK(f.name_expression(inverse, h).ends_with(", true, false, 0>"));
    CHECK(f.name_expression(forward, h).ends_with(", false, false, 0>"));
    CHECK(f.bytes_moved(inverse, 64) == f.bytes_moved(forward, 64));
    CHECK(inverse.key() != forward.key());
  }
  // rope_3d (table-free video angles) has no inverse.
  CHECK_THROWS_AS(kiln::family(Op::rope_3d)
                      .check(Problem{Op::rope_3d, DType::bf16, 2048, kiln::kRopeInverse, 16}),
                  kiln::ArgumentError);
}

TEST_CASE("a half table (one angle a pair) is a flag: the kernel's last argument, half the bytes") {
  const DeviceTraits device = DeviceTraits::for_arch(90);
  const kiln::Family& f = kiln::family(Op::rope);
  for (std::uint32_t flags :
       {kiln::kRopeHeadsEven | kiln::kRopeHeadsBy4, kiln::kRopeInterleaved | kiln::kRopeTableF32}) {
    const Problem full = rope(DType::bf16, 128, flags, 64);
    const Problem half = rope(DType::bf16, 128, flags | kiln::kRopeHalfTable, 64);
    CHECK(f.space(half, device) == f.space(full, device));
    const Config h = f.heuristic(half, device);
    CHECK(f.name_expression(half, h).ends_with(", true>"));
    CHECK(f.name_expression(half, h).starts_with(
        f.name_expression(full, h).substr(0, f.name_expression(full, h).size() - 1)));
    CHECK(half.key() != full.key());
    // A row of 32 angles where the full table has 64, in the buffers, strides and bytes.
    CHECK(f.buffers(half, 64)[2].elements * 2 == f.buffers(full, 64)[2].elements);
    const std::uint64_t addresses[] = {0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000};
    kiln::RopeParams params;
    std::memcpy(&params, f.pack_params(half, 64, addresses).data(), sizeof(params));
    CHECK(params.cos_strides[1] == 32);
    CHECK(params.sin_strides[1] == 32);
    const std::int64_t table_bytes = f.bytes_moved(full, 64) - f.bytes_moved(half, 64);
    CHECK(table_bytes * 2 == f.bytes_moved(full, 64) - 2 * 64 * 128 * 2);
  }
}

TEST_CASE("a head norm is a flag: the kernel's last argument, two weights, forward only") {
  const DeviceTraits device = DeviceTraits::for_arch(90);
  const kiln::Family& f = kiln::family(Op::rope);
  const std::uint32_t heads = kiln::rope_head_flags(32, 8);
  const Problem plain = rope(DType::bf16, 128, heads);
  const Problem normed = rope(DType::bf16, 128, heads | kiln::kRopeHeadNorm);
  CHECK(normed.key() != plain.key());
  const Config h = f.heuristic(normed, device);
  CHECK(h == f.heuristic(plain, device));
  const std::string name = f.name_expression(normed, h);
  CHECK(name.ends_with(", false, true>"));
  CHECK(name.starts_with(
      f.name_expression(plain, h).substr(0, f.name_expression(plain, h).size() - 1)));
  CHECK(f.name_expression(
             rope(DType::bf16, 128, heads | kiln::kRopeHeadNorm | kiln::kRopeHalfTable), h)
            .ends_with(", true, true>"));
  // The same space but the configs whose row spans warps (its sum meets by shuffles).
  Config wide = h;
  wide.vec_bytes = 2;
  wide.threads_per_row = 64;
  CHECK(f.invalid_reason(plain, wide, device).empty());
  CHECK(f.invalid_reason(normed, wide, device).find("spans warps") != std::string::npos);
  for (const Config& c : f.space(normed, device)) CHECK(c.threads_per_row <= 32);
  // The run's buffers: the weights after the table, the head dim each.
  const auto buffers = f.buffers(normed, 64);
  REQUIRE(buffers.size() == 8);
  CHECK(buffers[4].name == "q_weight");
  CHECK(buffers[5].name == "k_weight");
  CHECK(buffers[4].elements == 128);
  CHECK(!buffers[4].is_output);
  CHECK(f.bytes_moved(normed, 64) == f.bytes_moved(plain, 64) + 2 * 128 * 2);
  const std::uint64_t addresses[] = {0x1000, 0x2000, 0x3000, 0x4000,
                                     0x5000, 0x6000, 0x7000, 0x8000};
  kiln::RopeParams params;
  std::memcpy(&params, f.pack_params(normed, 64, addresses).data(), sizeof(params));
  CHECK(params.head_norm.q_weight == reinterpret_cast<const void*>(0x5000));
  CHECK(params.head_norm.k_weight == reinterpret_cast<const void*>(0x6000));
  CHECK(params.q_out == reinterpret_cast<void*>(0x7000));
  CHECK(params.head_norm.eps > 0.0f);
  CHECK_THROWS_AS(f.pack_params(normed, 64, std::span(addresses, 6)), kiln::Error);
  // No backward, and rope_3d takes none.
  CHECK_THROWS_WITH_AS(f.check(rope(DType::bf16, 128, kiln::kRopeHeadNorm | kiln::kRopeInverse)),
                       doctest::Contains("head-norm (256) without inverse (4)"),
                       kiln::ArgumentError);
  CHECK_THROWS_AS(kiln::family(Op::rope_3d)
                      .check(Problem{Op::rope_3d, DType::bf16, 2048, kiln::kRopeHeadNorm, 16}),
                  kiln::ArgumentError);
}

TEST_CASE("de-interleaving is a flag: the kernel's last argument, half-split units, no norm") {
  const DeviceTraits device = DeviceTraits::for_arch(90);
  const kiln::Family& f = kiln::family(Op::rope);
  // DeepSeek-V3's MLA call: 64 rotated columns, 128 q heads and one k head, half table.
  const std::uint32_t mla = kiln::kRopeHalfTable | kiln::rope_head_flags(128, 1);
  const Problem plain = rope(DType::bf16, 64, mla);
  const Problem pairs = rope(DType::bf16, 64, mla | kiln::kRopeDeinterleave);
  CHECK(pairs.key() != plain.key());
  // A unit is two vectors, adjacent in or out instead of R/2 apart: the same configs.
  CHECK(f.space(pairs, device) == f.space(plain, device));
  const Config h = f.heuristic(pairs, device);
  CHECK(h == f.heuristic(plain, device));
  CHECK(f.name_expression(pairs, h).ends_with(", true, false, true>"));
  CHECK(f.name_expression(rope(DType::bf16, 64, kiln::kRopeDeinterleave), h)
            .ends_with(", false, false, true>"));
  CHECK(f.bytes_moved(pairs, 64) == f.bytes_moved(plain, 64));
  for (std::uint32_t other : {kiln::kRopeInterleaved, kiln::kRopeHeadNorm}) {
    CHECK_THROWS_WITH_AS(f.check(rope(DType::bf16, 64, kiln::kRopeDeinterleave | other)),
                         doctest::Contains("de-interleave (512) without interleaved (1)"),
                         kiln::ArgumentError);
  }
  // Its inverse (the backward) is the same problem with kRopeInverse.
  CHECK_NOTHROW(f.check(rope(DType::bf16, 64, mla | kiln::kRopeDeinterleave | kiln::kRopeInverse)));
}

namespace {

// Whether the kernel of the config prefetches: the next-to-last template argument of
// kiln::rope (its last is the form) and of kiln::rms_norm_rope (its last is min_ctas).
bool prefetches(const kiln::Family& f, const Problem& p, const Config& c) {
  const std::string name = f.name_expression(p, c);
  const std::string without_last = name.substr(0, name.rfind(','));
  return without_last.ends_with(", true");
}

}  // namespace

TEST_CASE("persistent grids: rope_3d and rms_norm_rope offer them, rope does not") {
  const DeviceTraits device = DeviceTraits::for_arch(90);
  const Problem video{Op::rope_3d, DType::bf16, 2048, 0, 16};
  const Problem fused{Op::rms_norm_rope, DType::bf16, 2048, kiln::kRmsNormRopeVideo, 16};
  for (const Problem& p : {video, fused}) {
    const kiln::Family& f = kiln::family(p.op);
    int persistent = 0;
    for (const Config& c : f.space(p, device)) {
      const auto it = c.extra.find("grid");
      if (it == c.extra.end()) continue;
      ++persistent;
      // A whole number of SMs, capping the covering grid of a large call but not a small one.
      CHECK(it->second % device.sm_count == 0);
      CHECK(f.geometry(p, c, std::int64_t{1} << 24).grid[0] == it->second);
      CHECK(f.geometry(p, c, 1).grid[0] == 1);
      CHECK(prefetches(f, p, c));
      Config off = c;
      off.extra["grid"] = it->second + 1;
      CHECK(f.invalid_reason(p, off, device).find("is not a persistent grid") != std::string::npos);
    }
    CHECK(persistent > 0);
    // The heuristic covers the rows in one pass.
    const Config h = f.heuristic(p, device);
    CHECK(h.extra.find("grid") == h.extra.end());
    CHECK_FALSE(prefetches(f, p, h));
  }
  const kiln::Family& table_rope = kiln::family(Op::rope);
  Config c = table_rope.heuristic(rope(DType::bf16, 128), device);
  c.extra["grid"] = 132;
  CHECK(table_rope.invalid_reason(rope(DType::bf16, 128), c, device) ==
        "a persistent grid is offered to rope_3d only, whose per-thread angle frequencies it "
        "computes once for many rows");
  for (const Config& each : table_rope.space(rope(DType::bf16, 128), device)) {
    CHECK(each.extra.find("grid") == each.extra.end());
  }
}

TEST_CASE("the rms_norm_rope heuristic gives each token its own CTA") {
  const DeviceTraits device = DeviceTraits::for_arch(90);
  const kiln::Family& f = kiln::family(Op::rms_norm_rope);
  const Config h = f.heuristic(
      Problem{Op::rms_norm_rope, DType::bf16, 2048, kiln::kRmsNormRopeVideo, 16}, device);
  CHECK(h.vec_bytes == 16);
  CHECK(h.threads_per_row == 128);
  CHECK(h.cta_threads == 128);
}

TEST_CASE("rms_norm_rope offers min_ctas to the one-pass kernel that parks its angles") {
  const kiln::Family& f = kiln::family(Op::rms_norm_rope);
  const Problem video{Op::rms_norm_rope, DType::bf16, 2048, kiln::kRmsNormRopeVideo, 16};
  const Problem table{Op::rms_norm_rope, DType::bf16, 2048, kiln::kRmsNormRopeTableF32, 16};
  for (int sm : {80, 90}) {
    const DeviceTraits device = DeviceTraits::for_arch(sm);
    // The heuristic leaves registers to ptxas; beside it, 48 registers a thread: 10 CTAs of
    // 128 threads.
    Config h = f.heuristic(video, device);
    CHECK_FALSE(h.extra.contains("min_ctas"));
    CHECK(f.name_expression(video, h).ends_with(", true, false, 0>"));
    h.extra["min_ctas"] = 10;
    CHECK(f.invalid_reason(video, h, device).empty());
    CHECK(f.name_expression(video, h).ends_with(", true, false, 10>"));
    int offered = 0;
    for (const Config& c : f.space(video, device)) {
      const auto it = c.extra.find("min_ctas");
      if (it == c.extra.end()) continue;
      ++offered;
      CHECK(it->second * c.cta_threads * 48 <= device.regs_per_sm);
      CHECK(c.extra.find("grid") == c.extra.end());
      CHECK(c.threads_per_row > 32);
      // Each comes beside the same config without it.
      Config plain = c;
      plain.extra.erase("min_ctas");
      CHECK(f.invalid_reason(video, plain, device).empty());
      Config other = c;
      other.extra["min_ctas"] = it->second + 1;
      CHECK(f.invalid_reason(video, other, device).find("is not " + std::to_string(it->second)) !=
            std::string::npos);
    }
    CHECK(offered > 0);
    // Not with a table, whose kernel parks nothing (it spilled at 48 registers).
    for (const Config& c : f.space(table, device)) CHECK(c.extra.find("min_ctas") == c.extra.end());
    Config asked = f.heuristic(table, device);
    CHECK(asked.extra.find("min_ctas") == asked.extra.end());
    asked.extra["min_ctas"] = 10;
    CHECK(f.invalid_reason(table, asked, device).find("min_ctas is offered only") !=
          std::string::npos);
  }
  // sm_75 holds 1024 threads an SM, 8 CTAs of 128: at 64 registers, not offered.
  const DeviceTraits turing = DeviceTraits::for_arch(75);
  for (const Config& c : f.space(video, turing)) CHECK_FALSE(c.extra.contains("min_ctas"));
}
