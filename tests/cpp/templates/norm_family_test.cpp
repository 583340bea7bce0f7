// The norm ops' descriptors: accepted flags, kernel features, the search space and its
// persistent grids, the heuristic, buffers and parameter packing. No GPU, no NVRTC.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <string_view>

#include "cache/error.h"
#include "templates/kiln/norm_params.cuh"
#include "templates/norm_family.h"

namespace kiln {
namespace {

const NormFamily& norm_family(Op op) {
  return dynamic_cast<const NormFamily&>(family(op));
}

std::int64_t grid(const Config& config) {
  const auto it = config.extra.find("grid");
  return it == config.extra.end() ? 0 : it->second;
}

}  // namespace

TEST_CASE("each norm op is registered and accepts only its own flags") {
  for (Op op : {Op::fused_add_rms_norm, Op::layer_norm, Op::adaln, Op::gated_adaln}) {
    CHECK(family(op).op() == op);
    CHECK(family(op).header() == "kiln/norm.cuh");
  }
  const Problem bias_on_fused{Op::fused_add_rms_norm, DType::bf16, 4096, kNormBias, 16};
  CHECK_THROWS_WITH_AS(
      family(Op::fused_add_rms_norm).check(bias_on_fused),
      doctest::Contains(
          "flags: expected only weight (1), in-place (8), row loop (64), got bias (2)"),
      ArgumentError);
  // A bit no norm op takes is named by value, not dropped from the message.
  const Problem unknown_bit{Op::adaln, DType::bf16, 4096, kNormPerToken | 1024u, 16};
  CHECK_THROWS_WITH_AS(family(Op::adaln).check(unknown_bit),
                       doctest::Contains("got per-token (32), unknown bits 1024"), ArgumentError);
  const Problem table_on_layer{Op::layer_norm, DType::bf16, 4096, kNormTable, 16};
  CHECK_THROWS_AS(family(Op::layer_norm).check(table_on_layer), ArgumentError);
  const Problem too_wide{Op::adaln, DType::bf16, 65537, 0, 16};
  CHECK_THROWS_WITH_AS(
      family(Op::adaln).check(too_wide),
      doctest::Contains("kiln.adaln: x: expected hidden size in [1, 65536], got 65537"),
      ArgumentError);
  const Problem with_aux{Op::gated_adaln, DType::bf16, 64, 0, 16, 3};
  CHECK_THROWS_AS(family(Op::gated_adaln).check(with_aux), ArgumentError);
}

TEST_CASE("flags map to kernel features") {
  const Problem fused{Op::fused_add_rms_norm, DType::bf16, 64, kNormWeight | kNormInPlace, 16};
  CHECK(norm_family(Op::fused_add_rms_norm).features(fused) ==
        (NormFeature::residual | NormFeature::weight | NormFeature::in_place));
  const Problem ln{Op::layer_norm, DType::bf16, 64, kNormWeight | kNormBias, 16};
  CHECK(norm_family(Op::layer_norm).features(ln) ==
        (NormFeature::layer | NormFeature::weight | NormFeature::bias));
  const Problem ada{Op::adaln, DType::bf16, 64, kNormLayer | kNormPerToken, 16};
  CHECK(norm_family(Op::adaln).features(ada) == (NormFeature::modulate | NormFeature::layer));
  const Problem gated{Op::gated_adaln, DType::bf16, 64, kNormTable | kNormPerToken, 16};
  CHECK(norm_family(Op::gated_adaln).features(gated) ==
        (NormFeature::gate | NormFeature::modulate | NormFeature::table));
  // Per-sample operands ([B, 1, D]) are read through L1 where used: a kernel of their own.
  Problem per_sample = gated;
  per_sample.flags &= ~kNormPerToken;
  CHECK(norm_family(Op::gated_adaln).features(per_sample) ==
        (NormFeature::gate | NormFeature::modulate | NormFeature::table | NormFeature::per_sample));
  const Config config = family(Op::gated_adaln).heuristic(per_sample, DeviceTraits::for_arch(90));
  CHECK(family(Op::gated_adaln).name_expression(per_sample, config) !=
        family(Op::gated_adaln).name_expression(gated, config));
  const Problem plain{Op::rms_norm, DType::bf16, 64, kNormWeight, 16};
  CHECK((norm_family(Op::rms_norm).features(plain) & NormFeature::per_sample) == 0);
}

TEST_CASE("fp32 table rows beside 16-bit x (Wan's scale_shift_table)") {
  const Family& fam = family(Op::gated_adaln);
  const Problem wan{Op::gated_adaln, DType::bf16, 256, kNormLayer | kNormTable | kNormTableF32, 16};
  CHECK(norm_family(Op::gated_adaln).features(wan) ==
        (NormFeature::gate | NormFeature::modulate | NormFeature::layer | NormFeature::table |
         NormFeature::table_f32 | NormFeature::per_sample));
  // With fp32 x the rows are x's dtype: the kernel without the flag.
  Problem f32 = wan;
  f32.dtype = DType::f32;
  CHECK((norm_family(Op::gated_adaln).features(f32) & NormFeature::table_f32) == 0);
  // The rows are fp32 buffers, 4 bytes an element in the bytes moved.
  for (const BufferSpec& spec : fam.buffers(wan, 10)) {
    CHECK(spec.dtype == (spec.name.starts_with("table_") ? DType::f32 : DType::bf16));
  }
  CHECK(fam.bytes_moved(wan, 10) == (4 * 10 * 256 + 3 * 256) * 2 + 3 * 256 * 4);
  const Config config = fam.heuristic(wan, DeviceTraits::for_arch(90));
  Problem bf16_rows = wan;
  bf16_rows.flags &= ~kNormTableF32;
  CHECK(fam.name_expression(wan, config) != fam.name_expression(bf16_rows, config));
  // Only with table rows, and only for the adaln ops.
  Problem no_table = wan;
  no_table.flags &= ~kNormTable;
  CHECK_THROWS_WITH_AS(fam.check(no_table),
                       doctest::Contains("fp32 table (128) only with table (16)"), ArgumentError);
  const Problem ln{Op::layer_norm, DType::bf16, 256, kNormTableF32, 16};
  CHECK_THROWS_AS(family(Op::layer_norm).check(ln), ArgumentError);
}

TEST_CASE("the space is valid, canonical, and holds one-pass and persistent configs") {
  for (int sm : {75, 80, 90}) {
    const DeviceTraits traits = DeviceTraits::for_arch(sm);
    for (Op op : {Op::fused_add_rms_norm, Op::layer_norm, Op::adaln, Op::gated_adaln}) {
      for (std::int64_t hidden : {1, 7, 2048, 4545, 14848, 65536}) {
        for (DType dtype : {DType::f32, DType::bf16}) {
          const Problem problem{op, dtype, hidden, kNormWeight, hidden % 8 == 0 ? 16u : 2u};
          CAPTURE(problem.key());
          CAPTURE(sm);
          const NormFamily& fam = norm_family(op);
          const std::vector<Config> space = fam.space(problem, traits);
          REQUIRE(!space.empty());
          std::set<std::string> keys;
          bool persistent = false;
          for (const Config& config : space) {
            CHECK(fam.invalid_reason(problem, config, traits).empty());
            keys.insert(config.key());
            if (grid(config) > 0) {
              persistent = true;
              const std::int64_t wave =
                  traits.sm_count * fam.resident_ctas(problem, config, traits);
              CHECK((grid(config) == wave || grid(config) == 2 * wave));
            }
          }
          CHECK(keys.size() == space.size());
          // Short rows always leave room for a second row's registers.
          if (hidden <= 4096) CHECK(persistent);
          const Config heuristic = fam.heuristic(problem, traits);
          CHECK(std::find(space.begin(), space.end(), heuristic) != space.end());
          CHECK(grid(heuristic) == 0);
        }
      }
    }
  }
}

TEST_CASE("the row forms the fast search tries at diagonal neighbours are flags of the space") {
  const DeviceTraits traits = DeviceTraits::for_arch(90);
  const Problem problem{Op::adaln, DType::bf16, 8192, 0, 16u};
  const NormFamily& fam = norm_family(problem.op);
  const auto forms = fam.row_forms();
  REQUIRE(forms.size() == 2);
  for (std::string_view form : forms) {
    CAPTURE(form);
    const Config flagged{16, 128, 128, {{std::string(form), 1}}};
    CHECK(fam.invalid_reason(problem, flagged, traits).empty());
    const std::vector<Config> space = fam.space(problem, traits);
    CHECK(std::find(space.begin(), space.end(), flagged) != space.end());
  }
  // Other families keep their rows as they are.
  CHECK(family(Op::swiglu).row_forms().empty());
}

TEST_CASE("calls of at most one row per SM get the latency config; more rows the heuristic") {
  const DeviceTraits h200 = DeviceTraits::for_arch(90);
  for (Op op : {Op::rms_norm, Op::fused_add_rms_norm, Op::layer_norm, Op::adaln, Op::gated_adaln}) {
    const NormFamily& fam = norm_family(op);
    for (std::int64_t hidden : {1536, 2048, 4096, 5120, 8192, 14848}) {
      CAPTURE(op_name(op));
      CAPTURE(hidden);
      const Problem problem{op, DType::bf16, hidden, 0, 16};
      const Config row_blind = fam.heuristic(problem, h200);
      // Unknown rows and more rows than SMs: the row-blind heuristic.
      CHECK(fam.heuristic_for_rows(problem, h200, 0) == row_blind);
      CHECK(fam.heuristic_for_rows(problem, h200, 256) == row_blind);
      CHECK(fam.heuristic_for_rows(problem, h200, 4096) == row_blind);
      // One row a CTA, split finer: a thread holds at most 16 of the row's elements (8 for
      // gated_adaln's five operands, where a split of 1024 threads gets there), where the
      // held heuristic's hold up to 32 and share a CTA between rows. The H200 full tunes' best at 1
      // and 128 rows are of this shape (bench/results/tuning-2026-11-30-NVIDIA_H200-*rows-*).
      const Config latency = fam.heuristic_for_rows(problem, h200, 128);
      CHECK(fam.heuristic_for_rows(problem, h200, 1) == latency);
      CHECK(latency.cta_threads == latency.threads_per_row);
      CHECK(latency.threads_per_row > fam.held_heuristic(problem, h200).threads_per_row);
      const std::int64_t held = NormFamily::elements_per_thread(problem, latency);
      // (14848 is 1856 vectors: no split of at most 1024 threads gives one each)
      CHECK(held <= (op == Op::gated_adaln && hidden <= 8192 ? 8 : 16));
      CHECK(fam.invalid_reason(problem, latency, h200).empty());
    }
  }
  // The row count is against the device's SMs: 128 rows on an A100's 108 are more than one
  // wave of single rows.
  const DeviceTraits a100 = DeviceTraits::for_arch(80);
  const Problem llama{Op::rms_norm, DType::bf16, 4096, kNormWeight, 16};
  CHECK(family(Op::rms_norm).heuristic_for_rows(llama, a100, 128) ==
        family(Op::rms_norm).heuristic(llama, a100));
  CHECK(family(Op::rms_norm).heuristic_for_rows(llama, a100, 64).threads_per_row == 256);
  // Widths whose vectors a power of two does not split evenly take the whole-warp split.
  const Problem wan{Op::adaln, DType::bf16, 5120, 0, 16};
  CHECK(family(Op::adaln).heuristic_for_rows(wan, h200, 1).key() == "v16.t320.c320");
}

TEST_CASE("invalid configs say why") {
  const DeviceTraits traits = DeviceTraits::for_arch(90);
  const Family& fam = family(Op::layer_norm);
  const Problem problem{Op::layer_norm, DType::bf16, 4096, 0u, 16};
  Config config = fam.heuristic(problem, traits);
  config.extra["grid"] = 7;
  CHECK(fam.invalid_reason(problem, config, traits).find("is not a persistent grid") !=
        std::string::npos);
  config.extra.clear();
  config.extra["unroll"] = 2;
  CHECK(fam.invalid_reason(problem, config, traits) == "layer_norm has no tunable named 'unroll'");
  config.extra.clear();
  config.vec_bytes = 16;
  const Problem unaligned{Op::layer_norm, DType::bf16, 4096, 0u, 4};
  CHECK(fam.invalid_reason(unaligned, config, traits) ==
        "vec_bytes 16 exceeds the data alignment 4");
}

TEST_CASE("a persistent grid caps the launch; one pass covers every row") {
  const DeviceTraits traits = DeviceTraits::for_arch(90);
  const Family& fam = family(Op::fused_add_rms_norm);
  const Problem problem{Op::fused_add_rms_norm, DType::bf16, 8192, kNormWeight, 16};
  for (const Config& config : fam.space(problem, traits)) {
    CAPTURE(config.key());
    const std::int64_t rows_per_cta = config.rows_per_cta();
    // A clustered row takes a cluster of CTAs.
    const auto cluster = config.extra.find("cluster");
    const std::int64_t ctas_per_row = cluster == config.extra.end() ? 1 : cluster->second;
    const LaunchGeometry small = fam.geometry(problem, config, 3);
    CHECK(small.grid[0] == (3 + rows_per_cta - 1) / rows_per_cta * ctas_per_row);
    const LaunchGeometry large = fam.geometry(problem, config, 1 << 20);
    const std::int64_t all = ((1 << 20) + rows_per_cta - 1) / rows_per_cta * ctas_per_row;
    CHECK(large.grid[0] == (grid(config) > 0 ? std::min(all, grid(config)) : all));
    CHECK(large.block[0] == static_cast<unsigned>(config.cta_threads));
  }
}

TEST_CASE("buffers, bytes moved and packed parameters follow the op") {
  const Problem gated{Op::gated_adaln, DType::bf16, 256, kNormTable | kNormPerToken, 16};
  const Family& fam = family(Op::gated_adaln);
  const std::vector<BufferSpec> specs = fam.buffers(gated, 10);
  std::vector<std::string> names;
  for (const BufferSpec& spec : specs) names.push_back(spec.name);
  CHECK(names == std::vector<std::string>{"x", "y", "gate", "scale", "shift", "table_gate",
                                          "table_scale", "table_shift", "out", "sum_out"});
  // x, y, gate, scale, shift, out, sum_out: 7 row-sized streams, and 3 table rows.
  CHECK(fam.bytes_moved(gated, 10) == (7 * 10 * 256 + 3 * 256) * 2);
  Problem per_sample = gated;
  per_sample.flags &= ~kNormPerToken;
  CHECK(fam.bytes_moved(per_sample, 10) == (4 * 10 * 256 + 3 * 256 + 3 * 256) * 2);

  std::vector<std::uint64_t> addresses;
  for (std::size_t i = 0; i < specs.size(); ++i) addresses.push_back(0x1000 * (i + 1));
  const std::vector<std::byte> bytes = fam.pack_params(gated, 10, addresses);
  REQUIRE(bytes.size() == sizeof(NormParams));
  NormParams p;
  std::memcpy(&p, bytes.data(), sizeof(p));
  CHECK(reinterpret_cast<std::uintptr_t>(p.x) == 0x1000);
  CHECK(reinterpret_cast<std::uintptr_t>(p.second) == 0x2000);  // y
  CHECK(reinterpret_cast<std::uintptr_t>(p.gate.data) == 0x3000);
  CHECK(reinterpret_cast<std::uintptr_t>(p.shift.table) == 0x8000);
  CHECK(reinterpret_cast<std::uintptr_t>(p.sum_out) == 0xa000);
  CHECK(p.rows == 10);
  CHECK(p.scale.token_stride == 256);
  // One sample of 10 tokens; the kernel finds a row's sample with the magic, not a division.
  CHECK(p.tokens == 10);
  for (unsigned long long row : {0ull, 9ull, 10ull, 19ull, 12345ull, 1ull << 40}) {
    CHECK(quotient(row, p.tokens_divisor) == row / 10);
  }
  NormParams other{};
  set_tokens(other, 2688);
  CHECK(other.tokens == 2688);
  CHECK(quotient(2688ull * 3 + 5, other.tokens_divisor) == 3);
  addresses.pop_back();
  CHECK_THROWS_WITH_AS(fam.pack_params(gated, 10, addresses),
                       doctest::Contains("expected 10 addresses (x, y, gate"), Error);
}

// Where a piece of the parameters starts inside a layout, in bytes.
template <typename Piece, typename Layout>
std::ptrdiff_t offset_of_piece(const Layout& layout) {
  return reinterpret_cast<const std::byte*>(static_cast<const Piece*>(&layout)) -
         reinterpret_cast<const std::byte*>(&layout);
}

TEST_CASE("each kernel takes only the pieces of the parameters its features read") {
  // The pieces follow each other in every layout, as NVRTC lays them out for the device.
  const NormGatedArgs gated{};
  CHECK(offset_of_piece<NormCoreParams>(gated) == 0);
  CHECK(offset_of_piece<NormSumParams>(gated) == 64);
  CHECK(offset_of_piece<NormModulationParams>(gated) == 96);
  CHECK(offset_of_piece<NormGateParams>(gated) == 192);
  const NormModulatedArgs modulated{};
  CHECK(offset_of_piece<NormModulationParams>(modulated) == 64);
  const NormSumArgs summed{};
  CHECK(offset_of_piece<NormSumParams>(summed) == 64);

  NormParams params{};
  params.out = reinterpret_cast<void*>(0x100);
  params.x = reinterpret_cast<const void*>(0x200);
  params.eps = 0.5f;
  params.sum_out = reinterpret_cast<void*>(0x300);
  params.second_row_stride = 7;
  set_tokens(params, 2688);
  params.shift.token_stride = 9;
  params.gate.table = reinterpret_cast<const void*>(0x400);

  struct Case {
    Op op;
    std::uint32_t flags;
    std::size_t size;
  };
  for (const Case& c :
       {Case{Op::rms_norm, kNormWeight, 64}, Case{Op::layer_norm, kNormBias, 64},
        Case{Op::fused_add_rms_norm, kNormInPlace, 96},
        Case{Op::adaln, kNormTable | kNormPerToken, 160}, Case{Op::gated_adaln, kNormTable, 288}}) {
    CAPTURE(op_name(c.op));
    Problem problem;
    problem.op = c.op;
    problem.flags = c.flags;
    const unsigned features = norm_features(problem);
    CHECK(features == norm_family(c.op).features(problem));
    const NormArgBytes packed = pack_norm_args(features, params);
    REQUIRE(packed.size == c.size);
    NormCoreParams core{};
    std::memcpy(&core, packed.bytes.data(), sizeof(core));
    CHECK(core.out == params.out);
    CHECK(core.x == params.x);
    CHECK(core.eps == 0.5f);
    if (c.op == Op::fused_add_rms_norm) {
      NormSumArgs sum{};
      std::memcpy(&sum, packed.bytes.data(), sizeof(sum));
      CHECK(sum.sum_out == params.sum_out);
      CHECK(sum.second_row_stride == 7);
    }
    if (c.op == Op::adaln) {
      NormModulatedArgs modulated_args{};
      std::memcpy(&modulated_args, packed.bytes.data(), sizeof(modulated_args));
      CHECK(modulated_args.tokens == 2688);
      CHECK(modulated_args.shift.token_stride == 9);
      CHECK(quotient(2688ull * 3 + 5, modulated_args.tokens_divisor) == 3);
    }
    if (c.op == Op::gated_adaln) {
      NormGatedArgs gated_args{};
      std::memcpy(&gated_args, packed.bytes.data(), sizeof(gated_args));
      CHECK(gated_args.sum_out == params.sum_out);
      CHECK(gated_args.tokens == 2688);
      CHECK(gated_args.gate.table == params.gate.table);
    }
  }
}

TEST_CASE("common problems are valid specialisations") {
  for (Op op : {Op::fused_add_rms_norm, Op::layer_norm, Op::adaln, Op::gated_adaln}) {
    const std::vector<Problem> problems =
        family(op).common_problems(DType::bf16, 3072, kiln::PrewarmModel{});
    CHECK(!problems.empty());
    for (const Problem& problem : problems) CHECK_NOTHROW(family(op).check(problem));
  }
  // FLUX's double blocks: the seam over a LayerNorm without parameters, per-sample operands.
  const std::vector<Problem> gated =
      family(Op::gated_adaln).common_problems(DType::bf16, 3072, kiln::PrewarmModel{});
  CHECK(std::count_if(gated.begin(), gated.end(),
                      [](const Problem& p) { return p.flags == kNormLayer; }) == 1);
}

}  // namespace kiln

namespace kiln {

TEST_CASE("rms_norm_gated reads its gate as a second row stream and holds it with the row") {
  const Family& fam = family(Op::rms_norm_gated);
  CHECK(fam.header() == "kiln/norm.cuh");
  const Problem silu{Op::rms_norm_gated, DType::bf16, 128, kNormWeight, 16};
  const Problem sigmoid{Op::rms_norm_gated, DType::bf16, 128, kNormWeight | kNormGateSigmoid, 16};
  CHECK(norm_features(silu) == (NormFeature::weight | NormFeature::z_gate));
  CHECK(norm_features(sigmoid) ==
        (NormFeature::weight | NormFeature::z_gate | NormFeature::z_sigmoid));
  const Problem first{Op::rms_norm_gated, DType::bf16, 128, kNormGateFirst, 16};
  CHECK(norm_features(first) == (NormFeature::z_gate | NormFeature::z_first));
  const Problem biased{Op::rms_norm_gated, DType::bf16, 128, kNormBias, 16};
  CHECK_THROWS_WITH_AS(
      fam.check(biased),
      doctest::Contains(
          "flags: expected only weight (1), row loop (64), sigmoid gate (256), gate first (512), "
          "got bias (2)"),
      ArgumentError);

  // x, z, weight in; out: three rows and a weight row, and z is what pack_params passes as
  // the second stream of the 96-byte layout.
  const std::vector<BufferSpec> buffers = fam.buffers(silu, 10);
  REQUIRE(buffers.size() == 4);
  CHECK(buffers[1].name == "z");
  CHECK(buffers[1].elements == 10 * 128);
  CHECK(fam.bytes_moved(silu, 10) == (3 * 10 * 128 + 128) * 2);
  const std::vector<std::uint64_t> addresses = {0x100, 0x200, 0x300, 0x400};
  const std::vector<std::byte> packed = fam.pack_params(silu, 10, addresses);
  REQUIRE(packed.size() == sizeof(NormSumArgs));
  NormSumArgs args{};
  std::memcpy(&args, packed.data(), sizeof(args));
  CHECK(args.x == reinterpret_cast<const void*>(0x100));
  CHECK(args.second == reinterpret_cast<const void*>(0x200));
  CHECK(args.weight == reinterpret_cast<const void*>(0x300));
  CHECK(args.out == reinterpret_cast<void*>(0x400));
  CHECK(args.sum_out == nullptr);
  CHECK(args.second_row_stride == 128);

  // Neither re-read nor staged, at any width; the heuristic holds the row.
  const auto& norm = dynamic_cast<const NormFamily&>(fam);
  for (std::int64_t hidden : {128, 4096, 14848}) {
    CAPTURE(hidden);
    const Problem problem{Op::rms_norm_gated, DType::bf16, hidden, kNormWeight, 16};
    const DeviceTraits h100 = DeviceTraits::for_arch(90);
    CHECK(norm.row_streams(problem) == 2);
    const std::vector<Config> configs = fam.space(problem, h100);
    REQUIRE(!configs.empty());
    for (const Config& config : configs) {
      CHECK(config.extra.count("reread") == 0);
      CHECK(config.extra.count("stage") == 0);
    }
    const Config heuristic = fam.heuristic(problem, h100);
    CHECK(heuristic.extra.empty());
    Config reread = heuristic;
    reread.extra["reread"] = 1;
    CHECK(fam.invalid_reason(problem, reread, h100).find("neither re-read nor staged") !=
          std::string::npos);
  }
  const std::vector<Problem> common = fam.common_problems(DType::bf16, 128, PrewarmModel{});
  REQUIRE(common.size() == 1);
  CHECK(common[0] == silu);
}

}  // namespace kiln
