// The norm backward ops' descriptors: accepted flags, kernel features, the item split the
// partial sums rest on, the search space, the heuristic, buffers and parameter packing. No
// GPU, no NVRTC.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "cache/error.h"
#include "templates/kiln/norm_backward_params.cuh"
#include "templates/norm_backward_family.h"

namespace kiln {
namespace {

constexpr Op kBackwardOps[] = {Op::rms_norm_backward, Op::fused_add_rms_norm_backward,
                               Op::layer_norm_backward, Op::adaln_backward};

const NormBackwardFamily& backward(Op op) {
  return dynamic_cast<const NormBackwardFamily&>(family(op));
}

std::vector<std::string> names_of(const std::vector<BufferSpec>& specs) {
  std::vector<std::string> names;
  for (const BufferSpec& spec : specs) names.push_back(spec.name);
  return names;
}

}  // namespace

TEST_CASE("each norm backward op is registered once and accepts only its own flags") {
  const auto all = families();
  for (Op op : kBackwardOps) {
    CHECK(family(op).op() == op);
    CHECK(family(op).header() == "kiln/norm_backward.cuh");
    CHECK(std::count(all.begin(), all.end(), &family(op)) == 1);
  }
  CHECK(family(Op::adaln_backward).name() == "adaln_backward");
  CHECK(parse_op("layer_norm_backward") == Op::layer_norm_backward);
  CHECK_THROWS_AS(NormBackwardFamily(Op::rms_norm), Error);

  const Problem bias_on_rms{Op::rms_norm_backward, DType::bf16, 4096, kNormBias, 16};
  CHECK_THROWS_WITH_AS(
      family(Op::rms_norm_backward).check(bias_on_rms),
      doctest::Contains("flags: expected only weight (1), no weight gradient (128), partial sums "
                        "(8192), got bias (2)"),
      ArgumentError);
  const Problem per_token_on_ln{Op::layer_norm_backward, DType::bf16, 64, kNormShiftPerToken, 16};
  CHECK_THROWS_WITH_AS(family(Op::layer_norm_backward).check(per_token_on_ln),
                       doctest::Contains("got shift per token (64)"), ArgumentError);
  const Problem too_wide{Op::adaln_backward, DType::bf16, 65537, 0, 16};
  CHECK_THROWS_WITH_AS(
      family(Op::adaln_backward).check(too_wide),
      doctest::Contains("kiln.adaln_backward: x: expected hidden size in [1, 65536], got 65537"),
      ArgumentError);
  const Problem with_aux{Op::rms_norm_backward, DType::bf16, 64, 0, 16, 3};
  CHECK_THROWS_AS(family(Op::rms_norm_backward).check(with_aux), ArgumentError);
}

TEST_CASE("flags map to kernel features; the sums follow the parameters and per-sample operands") {
  const Problem rms{Op::rms_norm_backward, DType::bf16, 64, kNormWeight, 16};
  CHECK(backward(Op::rms_norm_backward).features(rms) ==
        (NormBackwardFeature::weight | NormBackwardFeature::weight_sum));
  CHECK(backward(Op::rms_norm_backward).has_partials(rms));
  const Problem bare{Op::rms_norm_backward, DType::bf16, 64, 0, 16};
  CHECK(backward(Op::rms_norm_backward).features(bare) == 0);
  CHECK_FALSE(backward(Op::rms_norm_backward).has_partials(bare));

  const Problem fused{Op::fused_add_rms_norm_backward, DType::bf16, 64, kNormWeight, 16};
  CHECK(backward(Op::fused_add_rms_norm_backward).features(fused) ==
        (NormBackwardFeature::weight | NormBackwardFeature::weight_sum |
         NormBackwardFeature::residual));
  const Problem ln{Op::layer_norm_backward, DType::bf16, 64, kNormWeight | kNormBias, 16};
  CHECK(backward(Op::layer_norm_backward).features(ln) ==
        (NormBackwardFeature::layer | NormBackwardFeature::weight |
         NormBackwardFeature::weight_sum | NormBackwardFeature::dy_sum));

  const NormBackwardFamily& ada = backward(Op::adaln_backward);
  const Problem per_sample{Op::adaln_backward, DType::bf16, 64, kNormLayer, 16};
  CHECK(ada.features(per_sample) == (NormBackwardFeature::modulate | NormBackwardFeature::layer |
                                     NormBackwardFeature::scale_sum | NormBackwardFeature::dy_sum));
  const Problem per_token{Op::adaln_backward, DType::bf16, 64,
                          kNormTable | kNormScalePerToken | kNormShiftPerToken, 16};
  CHECK(ada.features(per_token) == (NormBackwardFeature::modulate | NormBackwardFeature::table |
                                    NormBackwardFeature::scale_rows));
  CHECK_FALSE(ada.has_partials(per_token));
  // Per-token and per-sample operands are different kernels (unlike the forward's).
  const Config config = ada.heuristic(per_sample, DeviceTraits::for_arch(90));
  Problem per_token_layer = per_sample;
  per_token_layer.flags |= kNormScalePerToken | kNormShiftPerToken;
  CHECK(ada.name_expression(per_sample, config) != ada.name_expression(per_token_layer, config));
}

TEST_CASE("a call computes only the gradients it asks for") {
  const NormBackwardFamily& rms = backward(Op::rms_norm_backward);
  // A frozen weight still multiplies (dx needs it) but is summed nowhere.
  const Problem frozen{Op::rms_norm_backward, DType::bf16, 4096, kNormWeight | kNormSkipWeightGrad,
                       16};
  CHECK(rms.features(frozen) == NormBackwardFeature::weight);
  CHECK_FALSE(rms.has_partials(frozen));
  CHECK(names_of(rms.buffers(frozen, 8)) == std::vector<std::string>{"dy", "x", "weight", "dx"});
  const Problem trained{Op::rms_norm_backward, DType::bf16, 4096, kNormWeight, 16};
  Config config;
  config.vec_bytes = 16;
  config.threads_per_row = 256;
  config.cta_threads = 256;
  // Nothing summed across rows: without prefetch, one row per group (norm_backward_rows),
  // which holds the weight's two steps of four words where the trained kernel holds
  // sixteen fp32 sums.
  CHECK_FALSE(rms.item_kernel(frozen, config));
  CHECK(rms.item_kernel(trained, config));
  CHECK(rms.registers_per_thread(frozen, config) ==
        rms.registers_per_thread(trained, config) - 16 + 8);
  CHECK(rms.name_expression(frozen, config) ==
        "kiln::norm_backward_rows<kiln::bf16, 4096, 16, 256, 256, 2u>");
  CHECK(rms.name_expression(trained, config) ==
        "kiln::norm_backward<kiln::bf16, 4096, 16, 256, 256, 130u>");
  CHECK(rms.geometry(frozen, config, 2688).grid[0] == 2688);
  CHECK(rms.geometry(trained, config, 2688).grid[0] == 256);
  Config rows_per_cta = config;
  rows_per_cta.cta_threads = 512;
  CHECK(rms.geometry(frozen, rows_per_cta, 2689).grid[0] == 1345);
  // A prefetching config stays the items' kernel (the tuner chooses: at 14848 wide the
  // items with the next row in flight were faster), with the trained kernel's grid.
  const DeviceTraits traits = DeviceTraits::for_arch(90);
  Config prefetch = config;
  prefetch.extra["prefetch"] = 1;
  CHECK(rms.invalid_reason(frozen, prefetch, traits).empty());
  CHECK(rms.item_kernel(frozen, prefetch));
  CHECK(rms.name_expression(frozen, prefetch) ==
        "kiln::norm_backward<kiln::bf16, 4096, 16, 256, 256, 2u, true>");
  CHECK(rms.geometry(frozen, prefetch, 2688).grid[0] == 256);
  const auto configs = rms.space(frozen, traits);
  CHECK(std::any_of(configs.begin(), configs.end(),
                    [&](const Config& c) { return rms.item_kernel(frozen, c); }));
  CHECK(std::any_of(configs.begin(), configs.end(),
                    [&](const Config& c) { return !rms.item_kernel(frozen, c); }));
  CHECK_FALSE(rms.item_kernel(frozen, rms.heuristic(frozen, traits)));

  const NormBackwardFamily& ln = backward(Op::layer_norm_backward);
  const Problem bias_only{Op::layer_norm_backward, DType::bf16, 64,
                          kNormWeight | kNormBias | kNormSkipWeightGrad, 16};
  CHECK(ln.features(bias_only) ==
        (NormBackwardFeature::layer | NormBackwardFeature::weight | NormBackwardFeature::dy_sum));
  const Problem weight_only{Op::layer_norm_backward, DType::bf16, 64,
                            kNormWeight | kNormBias | kNormSkipBiasGrad, 16};
  CHECK(ln.features(weight_only) == (NormBackwardFeature::layer | NormBackwardFeature::weight |
                                     NormBackwardFeature::weight_sum));

  const NormBackwardFamily& ada = backward(Op::adaln_backward);
  constexpr std::uint32_t kPerToken = kNormTable | kNormScalePerToken | kNormShiftPerToken;
  constexpr unsigned kBase = NormBackwardFeature::modulate | NormBackwardFeature::table;
  const Problem operands_only{Op::adaln_backward, DType::bf16, 64, kPerToken, 16};
  CHECK(ada.features(operands_only) == (kBase | NormBackwardFeature::scale_rows));
  // The table rows' gradients are the kernel's sums over every row, beside dscale per token.
  const Problem with_tables{Op::adaln_backward, DType::bf16, 64,
                            kPerToken | kNormTableScaleGrad | kNormTableShiftGrad, 16};
  CHECK(ada.features(with_tables) ==
        (kBase | NormBackwardFeature::scale_rows | NormBackwardFeature::scale_sum |
         NormBackwardFeature::dy_sum));
  CHECK(names_of(ada.buffers(with_tables, 8)) ==
        std::vector<std::string>{"dy", "x", "scale", "table_scale", "dx", "dscale", "dy_partial",
                                 "scale_partial"});
  const Problem tables_only{
      Op::adaln_backward, DType::bf16, 64,
      kPerToken | kNormSkipScaleGrad | kNormSkipShiftGrad | kNormTableScaleGrad, 16};
  CHECK(ada.features(tables_only) == (kBase | NormBackwardFeature::scale_sum));
  // LoRA: nothing but dx.
  const Problem dx_only{Op::adaln_backward, DType::bf16, 64,
                        kNormLayer | kNormSkipScaleGrad | kNormSkipShiftGrad, 16};
  CHECK(ada.features(dx_only) == (NormBackwardFeature::modulate | NormBackwardFeature::layer));
  CHECK(names_of(ada.buffers(dx_only, 8)) == std::vector<std::string>{"dy", "x", "scale", "dx"});

  // The table rows' sums ride in the kernel up to 8192 wide.
  CHECK(NormBackwardFamily::table_sums_in_kernel(8192));
  CHECK_FALSE(NormBackwardFamily::table_sums_in_kernel(8200));

  // Sums per sample only where a [B, 1, D] operand's gradient is asked for.
  CHECK(NormBackwardFamily::sums_per_sample(0));
  CHECK(NormBackwardFamily::sums_per_sample(kNormScalePerToken));
  CHECK_FALSE(NormBackwardFamily::sums_per_sample(kNormShiftPerToken | kNormSkipScaleGrad));
  CHECK_FALSE(NormBackwardFamily::sums_per_sample(kNormScalePerToken | kNormShiftPerToken |
                                                  kNormTableScaleGrad | kNormTableShiftGrad));
  CHECK_FALSE(NormBackwardFamily::sums_per_sample(kNormSkipScaleGrad | kNormSkipShiftGrad));
  CHECK_THROWS_WITH_AS(
      rms.check(Problem{Op::rms_norm_backward, DType::bf16, 64, kNormSkipScaleGrad, 16}),
      doctest::Contains("no scale gradient (512)"), ArgumentError);
}

TEST_CASE("items: powers of two, never more than the rows, partial sums bounded") {
  CHECK(NormBackwardFamily::slots(4096, 1, 1) == 1);
  CHECK(NormBackwardFamily::slots(4096, 3, 1) == 4);
  CHECK(NormBackwardFamily::slots(4096, 1031, 1) == 256);
  CHECK(NormBackwardFamily::slots(4096, 1 << 20, 1) == 256);  // 2^20 / 4096
  CHECK(NormBackwardFamily::slots(2048, 16384, 1) == 512);
  CHECK(NormBackwardFamily::slots(14848, 2688, 1) == NormBackwardFamily::kMinItems);
  CHECK(NormBackwardFamily::slots(128, 1 << 20, 1) == 8192);
  CHECK(NormBackwardFamily::slots(1, 1 << 20, 1) == NormBackwardFamily::kMaxItems);
  CHECK(NormBackwardFamily::slots(65536, 1 << 20, 1) == NormBackwardFamily::kMinItems);
  // Per-sample sums: the samples share the bound.
  CHECK(NormBackwardFamily::slots(4096, 4096, 8) == 32);
  CHECK(NormBackwardFamily::slots(4096, 4096, 3) == 64);
  CHECK(NormBackwardFamily::slots(4096, 4096, 5000) == 1);
  CHECK(NormBackwardFamily::slots(4096, 0, 2) == 1);
  for (std::int64_t hidden : {1, 7, 128, 4096, 5120, 65536}) {
    for (std::int64_t rows : {0, 1, 3, 1031, 1 << 20}) {
      for (std::int64_t segments : {1, 2, 7, 64}) {
        CAPTURE(hidden);
        CAPTURE(rows);
        CAPTURE(segments);
        const std::int64_t slots = NormBackwardFamily::slots(hidden, rows, segments);
        CHECK(slots >= 1);
        CHECK((slots & (slots - 1)) == 0);
        CHECK(slots <= std::max<std::int64_t>(rows, 1) * 2);
        CHECK(slots * segments * hidden <=
              std::max(NormBackwardFamily::kPartialElements,
                       segments * hidden * NormBackwardFamily::kMinItems));
      }
      CHECK(NormBackwardFamily::groups(hidden, rows) == NormBackwardFamily::slots(hidden, rows, 1));
    }
  }
}

TEST_CASE("the space is valid and canonical, and the heuristic is in it") {
  for (int sm : {75, 80, 90}) {
    const DeviceTraits traits = DeviceTraits::for_arch(sm);
    for (Op op : kBackwardOps) {
      for (std::int64_t hidden : {1, 7, 128, 2048, 4545, 5120, 14848, 65536}) {
        for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
          const Problem problem{op, dtype, hidden, kNormWeight, hidden % 8 == 0 ? 16u : 2u};
          CAPTURE(problem.key());
          CAPTURE(sm);
          const NormBackwardFamily& fam = backward(op);
          const std::vector<Config> space = fam.space(problem, traits);
          REQUIRE(!space.empty());
          std::set<std::string> keys;
          for (const Config& config : space) {
            CHECK(fam.invalid_reason(problem, config, traits).empty());
            for (const auto& [extra, value] : config.extra) {
              CHECK((extra == "prefetch" || extra == "shared_sums"));
              CHECK(value == 1);
            }
            if (config.extra.count("shared_sums") == 1) {
              CHECK(hidden > NormBackwardFamily::kMaxHiddenForRegisterSums);
            }
            CHECK(NormBackwardFamily::elements_per_thread(problem, config) <=
                  NormBackwardFamily::kMaxElementsPerThread);
            keys.insert(config.key());
          }
          CHECK(keys.size() == space.size());
          const Config heuristic = fam.heuristic(problem, traits);
          CHECK(std::find(space.begin(), space.end(), heuristic) != space.end());
          CHECK(heuristic.vec_bytes == space.front().vec_bytes);
        }
      }
    }
  }
}

TEST_CASE("a prefetching config holds a second row where it fits, and is its own kernel") {
  const DeviceTraits traits = DeviceTraits::for_arch(90);
  const NormBackwardFamily& fam = backward(Op::rms_norm_backward);
  const Problem problem{Op::rms_norm_backward, DType::bf16, 4096, kNormWeight, 16};
  Config plain;
  plain.vec_bytes = 16;
  plain.threads_per_row = 256;
  plain.cta_threads = 256;
  Config prefetch = plain;
  prefetch.extra["prefetch"] = 1;
  CHECK(fam.invalid_reason(problem, prefetch, traits).empty());
  // Two steps of two 16-byte streams, four words each: 16 more registers.
  CHECK(fam.registers_per_thread(problem, prefetch) ==
        fam.registers_per_thread(problem, plain) + 16);
  CHECK(fam.name_expression(problem, prefetch) ==
        "kiln::norm_backward<kiln::bf16, 4096, 16, 256, 256, 130u, true>");
  CHECK(fam.name_expression(problem, plain) ==
        "kiln::norm_backward<kiln::bf16, 4096, 16, 256, 256, 130u>");
  const std::vector<Config> space = fam.space(problem, traits);
  CHECK(std::find(space.begin(), space.end(), prefetch) != space.end());
  prefetch.extra["prefetch"] = 2;
  CHECK(fam.invalid_reason(problem, prefetch, traits) == "prefetch 2 is neither 0 nor 1");

  // The widest split of a 64-element share stays valid for the plain kernel (it may spill);
  // a second row on top of it is not offered.
  const Problem wide{Op::adaln_backward, DType::f32, 65536, kNormWeight, 16};
  Config widest;
  widest.vec_bytes = 16;
  widest.threads_per_row = 1024;
  widest.cta_threads = 1024;
  CHECK(backward(Op::adaln_backward).invalid_reason(wide, widest, traits).empty());
  widest.extra["prefetch"] = 1;
  CHECK(backward(Op::adaln_backward).invalid_reason(wide, widest, traits).find("registers") !=
        std::string::npos);
}

TEST_CASE("past 8192 wide the parameter sums may live in shared memory") {
  const DeviceTraits traits = DeviceTraits::for_arch(90);
  const NormBackwardFamily& fam = backward(Op::layer_norm_backward);
  const Problem wide{Op::layer_norm_backward, DType::bf16, 14848, kNormWeight | kNormBias, 16};
  const Config plain{16, 512, 512, {}};
  Config shared{16, 512, 512, {{"shared_sums", 1}}};
  // 32 elements a thread, two sums of them: 64 registers fewer, and 32 x 2 x 512 fp32 of
  // shared memory. The registers' version does not fit a 512-thread CTA.
  CHECK(fam.registers_per_thread(wide, shared) == fam.registers_per_thread(wide, plain) - 64);
  CHECK(fam.invalid_reason(wide, plain, traits).find("registers") != std::string::npos);
  CHECK(fam.invalid_reason(wide, shared, traits).empty());
  CHECK(fam.shared_sums_bytes(wide, shared) == 32 * 2 * 512 * 4);
  CHECK(fam.shared_sums_bytes(wide, plain) == 0);
  CHECK(fam.geometry(wide, shared, 2688).smem_bytes == 32 * 2 * 512 * 4);
  CHECK(fam.geometry(wide, plain, 2688).smem_bytes == 0);
  CHECK(fam.name_expression(wide, shared) ==
        "kiln::norm_backward<kiln::bf16, 14848, 16, 512, 512, " +
            std::to_string(fam.features(wide)) + "u, false, true>");
  Config both = shared;
  both.extra["prefetch"] = 1;
  CHECK(fam.name_expression(wide, both) == "kiln::norm_backward<kiln::bf16, 14848, 16, 512, 512, " +
                                               std::to_string(fam.features(wide)) +
                                               "u, true, true>");
  const std::vector<Config> space = fam.space(wide, traits);
  CHECK(std::find(space.begin(), space.end(), shared) != space.end());
  shared.extra["shared_sums"] = 2;
  CHECK(fam.invalid_reason(wide, shared, traits) == "shared_sums 2 is neither 0 nor 1");
  shared.extra["shared_sums"] = 1;

  // Up to 8192 wide the space keeps the sums in registers; a pinned config may still ask.
  const Problem narrow{Op::layer_norm_backward, DType::bf16, 8192, kNormWeight | kNormBias, 16};
  for (const Config& config : fam.space(narrow, traits))
    CHECK(config.extra.count("shared_sums") == 0);
  CHECK(fam.invalid_reason(narrow, shared, traits).empty());
  // Nothing summed (weight and bias frozen), nothing to hold.
  const Problem frozen{Op::layer_norm_backward, DType::bf16, 14848,
                       kNormWeight | kNormBias | kNormSkipWeightGrad | kNormSkipBiasGrad, 16};
  CHECK(fam.invalid_reason(frozen, shared, traits) ==
        "shared_sums holds the parameter sums, and this problem sums none");
  for (const Config& config : fam.space(frozen, traits))
    CHECK(config.extra.count("shared_sums") == 0);
  // sm_75 opts in to 64 KB a CTA: 128 KB of sums do not fit.
  const DeviceTraits turing = DeviceTraits::for_arch(75);
  CHECK(fam.invalid_reason(wide, shared, turing).find("bytes of shared memory") !=
        std::string::npos);
}

TEST_CASE("the heuristic aims at 16 elements per thread on common rows") {
  const DeviceTraits traits = DeviceTraits::for_arch(90);
  const Problem problem{Op::rms_norm_backward, DType::bf16, 4096, kNormWeight, 16};
  const Config config = family(Op::rms_norm_backward).heuristic(problem, traits);
  CHECK(config.vec_bytes == 16);
  CHECK(NormBackwardFamily::elements_per_thread(problem, config) == 16);
}

TEST_CASE("invalid configs say why") {
  const DeviceTraits traits = DeviceTraits::for_arch(90);
  const Family& fam = family(Op::layer_norm_backward);
  const Problem problem{Op::layer_norm_backward, DType::bf16, 4096, kNormWeight | kNormBias, 16};
  Config config = fam.heuristic(problem, traits);
  config.extra["grid"] = 132;
  CHECK(fam.invalid_reason(problem, config, traits) ==
        "layer_norm_backward has no tunable named 'grid'");
  config.extra.clear();
  const Problem unaligned{Op::layer_norm_backward, DType::bf16, 4096, kNormWeight, 4};
  CHECK(fam.invalid_reason(unaligned, config, traits) ==
        "vec_bytes 16 exceeds the data alignment 4");
  Config narrow;
  narrow.vec_bytes = 2;
  narrow.threads_per_row = 4;
  narrow.cta_threads = 128;
  CHECK(fam.invalid_reason(problem, narrow, traits).find("more than 64") != std::string::npos);
  Config idle;
  idle.vec_bytes = 16;
  idle.threads_per_row = 1024;
  idle.cta_threads = 1024;
  CHECK(fam.invalid_reason(problem, idle, traits).find("leaves threads idle") != std::string::npos);
  Config uneven;
  uneven.vec_bytes = 16;
  uneven.threads_per_row = 256;
  uneven.cta_threads = 96;
  CHECK(fam.invalid_reason(problem, uneven, traits) ==
        "cta_threads 96 is not 64, 128, 256, 512 or 1024");
  // Three fp32 sums per element on top of the rows: too many registers for 64 elements.
  const Problem adaln{Op::adaln_backward, DType::f32, 16384, kNormWeight, 16};
  Config heavy;
  heavy.vec_bytes = 16;
  heavy.threads_per_row = 256;
  heavy.cta_threads = 256;
  CHECK(family(Op::adaln_backward).invalid_reason(adaln, heavy, traits).find("registers") !=
        std::string::npos);
}

TEST_CASE("the grid covers the items of the rows, whatever the config") {
  const DeviceTraits traits = DeviceTraits::for_arch(90);
  const Family& fam = family(Op::rms_norm_backward);
  const Problem problem{Op::rms_norm_backward, DType::bf16, 4096, kNormWeight, 16};
  for (const Config& config : fam.space(problem, traits)) {
    const std::int64_t rows_per_cta = config.rows_per_cta();
    for (std::int64_t rows : {1, 3, 1031, 1 << 20}) {
      const LaunchGeometry geometry = fam.geometry(problem, config, rows);
      const std::int64_t groups = NormBackwardFamily::groups(4096, rows);
      CHECK(geometry.grid[0] == (groups + rows_per_cta - 1) / rows_per_cta);
      CHECK(geometry.block[0] == static_cast<unsigned>(config.cta_threads));
    }
  }
}

TEST_CASE("buffers, bytes moved and packed parameters follow the op") {
  const Family& ada = family(Op::adaln_backward);
  const Problem per_sample{Op::adaln_backward, DType::bf16, 256, kNormWeight | kNormTable, 16};
  const std::vector<BufferSpec> specs = ada.buffers(per_sample, 10);
  CHECK(names_of(specs) == std::vector<std::string>{"dy", "x", "scale", "table_scale", "weight",
                                                    "dx", "weight_partial", "dy_partial",
                                                    "scale_partial"});
  // 10 rows: 16 items (rounded up to a power of two), three fp32 partial sums of 16 rows.
  CHECK(specs.back().dtype == DType::f32);
  CHECK(specs.back().elements == 16 * 256);
  CHECK(specs.back().is_output);
  CHECK(ada.bytes_moved(per_sample, 10) == (3 * 10 * 256 + 3 * 256) * 2 + 3 * 16 * 256 * 4);

  const Problem per_token{Op::adaln_backward, DType::bf16, 256,
                          kNormScalePerToken | kNormShiftPerToken, 16};
  CHECK(names_of(ada.buffers(per_token, 10)) ==
        std::vector<std::string>{"dy", "x", "scale", "dx", "dscale"});
  CHECK(ada.bytes_moved(per_token, 10) == 5 * 10 * 256 * 2);

  const Family& fused = family(Op::fused_add_rms_norm_backward);
  const Problem problem{Op::fused_add_rms_norm_backward, DType::f32, 64, kNormWeight, 16};
  const std::vector<BufferSpec> fused_specs = fused.buffers(problem, 3);
  CHECK(names_of(fused_specs) ==
        std::vector<std::string>{"dy", "x", "dr", "weight", "dx", "weight_partial"});
  std::vector<std::uint64_t> addresses;
  for (std::size_t i = 0; i < fused_specs.size(); ++i) addresses.push_back(0x1000 * (i + 1));
  const std::vector<std::byte> bytes = fused.pack_params(problem, 3, addresses);
  REQUIRE(bytes.size() == sizeof(NormBackwardParams));
  NormBackwardParams p;
  std::memcpy(&p, bytes.data(), sizeof(p));
  CHECK(reinterpret_cast<std::uintptr_t>(p.dy) == 0x1000);
  CHECK(reinterpret_cast<std::uintptr_t>(p.x) == 0x2000);
  CHECK(reinterpret_cast<std::uintptr_t>(p.dr) == 0x3000);
  CHECK(reinterpret_cast<std::uintptr_t>(p.weight) == 0x4000);
  CHECK(reinterpret_cast<std::uintptr_t>(p.dx) == 0x5000);
  CHECK(reinterpret_cast<std::uintptr_t>(p.weight_partial) == 0x6000);
  CHECK(p.dy_partial == nullptr);
  CHECK(p.scale == nullptr);
  CHECK(p.rows == 3);
  CHECK(p.segments == 1);
  CHECK(p.segment_rows == 3);
  CHECK(p.slots == 4);
  CHECK(p.x_row_stride == 64);
  addresses.pop_back();
  CHECK_THROWS_WITH_AS(fused.pack_params(problem, 3, addresses),
                       doctest::Contains("expected 6 addresses (dy, x, dr"), Error);
}

TEST_CASE("common problems are valid specialisations") {
  for (Op op : kBackwardOps) {
    const std::vector<Problem> problems =
        family(op).common_problems(DType::bf16, 3072, kiln::PrewarmModel{});
    CHECK(!problems.empty());
    for (const Problem& problem : problems) CHECK_NOTHROW(family(op).check(problem));
    // Every op trains a parameter somewhere, so its partial sums' kernel is prewarmed too,
    // for every dtype.
    const auto sums = [](const std::vector<Problem>& list) {
      return std::count_if(list.begin(), list.end(),
                           [](const Problem& p) { return NormBackwardFamily::sums_partials(p); });
    };
    CHECK(sums(problems) == 1);
    const std::vector<Problem> f32 = family(op).common_problems(DType::f32, 3072, {});
    CHECK(sums(f32) == 1);
    CHECK(f32.size() == problems.size());
  }
}

TEST_CASE("the partial sums are a problem of their own: fp32 rows in, the gradient's dtype out") {
  const DeviceTraits device = DeviceTraits::for_arch(90);
  for (Op op : kBackwardOps) {
    const NormBackwardFamily& f = backward(op);
    const Problem sums{op, DType::bf16, 8192, kNormSumPartials, 16};
    CHECK_NOTHROW(f.check(sums));
    // Alone: a backward call's own bits never come with it.
    const Problem mixed{op, DType::bf16, 8192, kNormSumPartials | kNormWeight, 16};
    CHECK_THROWS_WITH_AS(f.check(mixed), doctest::Contains("partial sums (8192) alone"),
                         ArgumentError);
    const Config h = f.heuristic(sums, device);
    CHECK(h.vec_bytes == 16);
    CHECK(h.threads_per_row == 32);
    CHECK(h.cta_threads == 1024);
    CHECK(f.name_expression(sums, h) == "kiln::sum_partials<kiln::bf16, 8192, 16, 32, 1024>");
    // 2048 vectors of 4 floats, 32 a CTA; the rows are the kernel's to walk.
    const LaunchGeometry g = f.geometry(sums, h, 256);
    CHECK(g.grid[0] == 64);
    CHECK(g.block[0] == 1024);
    CHECK(f.geometry(sums, h, 1).grid[0] == 64);
    const auto specs = f.buffers(sums, 256);
    REQUIRE(specs.size() == 2);
    CHECK(specs[0].dtype == DType::f32);
    CHECK(specs[0].elements == 256 * 8192);
    CHECK_FALSE(specs[0].is_output);
    CHECK(specs[1].dtype == DType::bf16);
    CHECK(specs[1].elements == 8192);
    CHECK(specs[1].is_output);
    CHECK(specs[0].summed_terms == 1);
    CHECK(specs[1].summed_terms == 256);  // the evaluator allows for reordering 256 terms
    CHECK(f.bytes_moved(sums, 256) == 256 * 8192 * 4 + 8192 * 2);
    const std::uint64_t addresses[] = {0x1000, 0x2000};
    PartialSumParams params;
    const auto bytes = f.pack_params(sums, 256, addresses);
    REQUIRE(bytes.size() == sizeof(params));
    std::memcpy(&params, bytes.data(), sizeof(params));
    CHECK(params.items == 256);
    CHECK(params.segments == 1);
    CHECK(reinterpret_cast<std::uintptr_t>(params.out) == 0x2000);
  }
  // fp32 gradients too: their sum is the same kernel, storing fp32.
  const NormBackwardFamily& layer = backward(Op::layer_norm_backward);
  const Problem f32_sums{Op::layer_norm_backward, DType::f32, 768, kNormSumPartials, 16};
  CHECK_NOTHROW(layer.check(f32_sums));
  CHECK(layer.name_expression(f32_sums, layer.heuristic(f32_sums, device)) ==
        "kiln::sum_partials<float, 768, 16, 32, 1024>");
  // A row that is not whole 16-byte fp32 vectors takes narrower ones; every config says why
  // it is refused.
  const NormBackwardFamily& f = backward(Op::rms_norm_backward);
  const Problem odd{Op::rms_norm_backward, DType::f16, 4098, kNormSumPartials, 16};
  CHECK(f.heuristic(odd, device).vec_bytes == 8);
  for (const Config& c : f.space(odd, device)) CHECK(c.vec_bytes <= 8);
  Config bad = f.heuristic(odd, device);
  bad.vec_bytes = 16;
  CHECK(f.invalid_reason(odd, bad, device).find("not whole 16-byte vectors") != std::string::npos);
  bad = f.heuristic(odd, device);
  bad.extra["prefetch"] = 1;
  CHECK(f.invalid_reason(odd, bad, device).find("no tunable named 'prefetch'") !=
        std::string::npos);
  bad = f.heuristic(odd, device);
  bad.cta_threads = 128;
  CHECK_FALSE(f.invalid_reason(odd, bad, device).empty());
}

}  // namespace kiln
