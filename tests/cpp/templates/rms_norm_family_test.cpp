#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cache/error.h"
#include "templates/family.h"
#include "templates/kiln/norm_params.cuh"
#include "templates/rms_norm_family.h"

using kiln::Config;
using kiln::DeviceTraits;
using kiln::DType;
using kiln::Op;
using kiln::Problem;

namespace {

const kiln::Family& rms() {
  return kiln::family(Op::rms_norm);
}

const kiln::NormFamily& norm() {
  return dynamic_cast<const kiln::NormFamily&>(rms());
}

Problem problem(DType dtype, std::int64_t hidden, bool weight = true, std::uint32_t align = 16) {
  return Problem{Op::rms_norm, dtype, hidden, weight ? kiln::kRmsNormHasWeight : 0u, align};
}

Config config(int vec, int tpr, int cta) {
  Config c;
  c.vec_bytes = vec;
  c.threads_per_row = tpr;
  c.cta_threads = cta;
  return c;
}

constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16};
constexpr std::int64_t kHiddens[] = {1, 7, 768, 2048, 3072, 4096, 4545, 5120, 8192, 14848};
constexpr std::uint32_t kAligns[] = {16, 2};
constexpr int kArchs[] = {75, 80, 90};

bool power_of_two(std::int64_t v) {
  return v > 0 && (v & (v - 1)) == 0;
}

// The space's rules restated from the family's contract, independently of its code.
void check_config_obeys_rules(const Problem& p, const Config& c, const DeviceTraits& device) {
  const auto element = static_cast<int>(kiln::dtype_size(p.dtype));
  const int vec_elems = c.vec_bytes / element;
  const int align = std::max<int>(static_cast<int>(p.align), element);
  CHECK((c.vec_bytes == 2 || c.vec_bytes == 4 || c.vec_bytes == 8 || c.vec_bytes == 16));
  CHECK(c.vec_bytes >= element);
  CHECK(c.vec_bytes <= align);
  CHECK((p.hidden * element) % c.vec_bytes == 0);
  const std::int64_t vectors = p.hidden * element / c.vec_bytes;
  // Powers of two, or whole warps splitting the row's vectors exactly.
  CHECK((power_of_two(c.threads_per_row) ||
         (c.threads_per_row % 32 == 0 && vectors % c.threads_per_row == 0)));
  CHECK(c.threads_per_row >= 4);
  CHECK(c.threads_per_row <= 1024);
  CHECK((c.threads_per_row == 4 || c.threads_per_row * vec_elems <= p.hidden));
  // A clustered row is shared by the threads of all the cluster's CTAs.
  const auto cluster = c.extra.find("cluster");
  const std::int64_t row_threads =
      std::int64_t{c.threads_per_row} * (cluster == c.extra.end() ? 1 : cluster->second);
  const std::int64_t steps = (p.hidden + vec_elems * row_threads - 1) / (vec_elems * row_threads);
  CHECK(steps * vec_elems <= 64);
  CHECK(row_threads <= vectors + (c.threads_per_row == 4 ? 3 : 0));
  CHECK(c.cta_threads % c.threads_per_row == 0);
  CHECK(power_of_two(c.cta_threads / c.threads_per_row));
  CHECK((power_of_two(c.threads_per_row) ? c.cta_threads >= 64 : true));
  CHECK(c.cta_threads <= device.max_threads_per_block);
  // The extras are a persistent grid (whole waves of the device's SMs), a row staged in
  // shared memory, a row read twice (4 KB or more) and a row split over a cluster of CTAs.
  for (const auto& [name, value] : c.extra) {
    CHECK((name == "grid" || name == "stage" || name == "reread" || name == "cluster"));
    CHECK((name != "reread" || (value == 1 && p.hidden * element >= 4096)));
    CHECK((name != "grid" || value % device.sm_count == 0));
    CHECK((name != "stage" || value == 1));
    CHECK((name != "cluster" || value == 2 || value == 4 || value == 8));
  }
}

}  // namespace

TEST_CASE("the registry serves the rms_norm family") {
  const kiln::Family& f = kiln::family(Op::rms_norm);
  CHECK(f.op() == Op::rms_norm);
  CHECK(f.name() == "rms_norm");
  CHECK(f.header() == "kiln/norm.cuh");
  CHECK(&f == &kiln::family(Op::rms_norm));
  // Other families register beside it: rms_norm is listed once, as this family.
  const auto all = kiln::families();
  CHECK(std::count(all.begin(), all.end(), &f) == 1);
  for (const kiln::Family* other : all) CHECK((other == &f) == (other->op() == Op::rms_norm));
}

TEST_CASE("check rejects problems that cannot be specialised") {
  CHECK_NOTHROW(rms().check(problem(DType::bf16, 1)));
  CHECK_NOTHROW(rms().check(problem(DType::bf16, 65536)));
  CHECK_THROWS_WITH_AS(rms().check(problem(DType::bf16, 0)),
                       "kiln.rms_norm: x: expected hidden size in [1, 65536], got 0",
                       kiln::ArgumentError);
  CHECK_THROWS_AS(rms().check(problem(DType::bf16, 65537)), kiln::ArgumentError);
  CHECK_THROWS_AS(rms().check(problem(DType::bf16, -4)), kiln::ArgumentError);
  CHECK_THROWS_WITH_AS(rms().check(problem(DType::bf16, 4096, true, 3)),
                       doctest::Contains("power of two"), kiln::ArgumentError);
  CHECK_THROWS_AS(rms().check(problem(DType::bf16, 4096, true, 32)), kiln::ArgumentError);
  CHECK_THROWS_AS(rms().check(problem(DType::bf16, 4096, true, 0)), kiln::ArgumentError);
  Problem unknown_flag = problem(DType::bf16, 4096);
  unknown_flag.flags = 2;
  CHECK_THROWS_WITH_AS(rms().check(unknown_flag), doctest::Contains("flags"), kiln::ArgumentError);
  CHECK_THROWS_AS(rms().space(problem(DType::f16, 0), DeviceTraits::for_arch(90)),
                  kiln::ArgumentError);
}

TEST_CASE("space is non-empty, valid and canonically ordered for common problems") {
  for (int sm : kArchs) {
    const DeviceTraits device = DeviceTraits::for_arch(sm);
    for (DType dtype : kDTypes) {
      for (std::int64_t hidden : kHiddens) {
        for (bool weight : {true, false}) {
          for (std::uint32_t align : kAligns) {
            const Problem p = problem(dtype, hidden, weight, align);
            CAPTURE(p.key());
            CAPTURE(sm);
            const std::vector<Config> space = rms().space(p, device);
            REQUIRE_FALSE(space.empty());
            std::set<std::string> keys;
            for (const Config& c : space) {
              CAPTURE(c.key());
              CHECK(rms().invalid_reason(p, c, device) == "");
              check_config_obeys_rules(p, c, device);
              CHECK(keys.insert(c.key()).second);
            }
            const bool ordered =
                std::is_sorted(space.begin(), space.end(), [](const Config& a, const Config& b) {
                  return std::tuple(-a.vec_bytes, a.threads_per_row, a.cta_threads,
                                    a.extra.size()) <
                         std::tuple(-b.vec_bytes, b.threads_per_row, b.cta_threads, b.extra.size());
                });
            CHECK(ordered);
          }
        }
      }
    }
  }
}

TEST_CASE("space holds every one-pass power-of-two point invalid_reason accepts, and only those") {
  const DeviceTraits device = DeviceTraits::for_arch(90);
  for (const Problem& p : {problem(DType::bf16, 4096), problem(DType::f32, 14848, false, 8),
                           problem(DType::f16, 4545, true, 16)}) {
    std::vector<Config> space;
    for (const Config& c : rms().space(p, device)) {
      if (c.extra.empty() && power_of_two(c.threads_per_row)) space.push_back(c);
    }
    std::size_t accepted = 0;
    for (int vec : {1, 2, 4, 8, 16, 32}) {
      for (int tpr = 1; tpr <= 2048; tpr *= 2) {
        for (int cta = 32; cta <= 2048; cta *= 2) {
          const Config c = config(vec, tpr, cta);
          const bool valid = rms().invalid_reason(p, c, device).empty();
          const bool listed = std::find(space.begin(), space.end(), c) != space.end();
          CAPTURE(c.key());
          CHECK(valid == listed);
          accepted += valid ? 1 : 0;
        }
      }
    }
    CHECK(accepted == space.size());
  }
}

TEST_CASE("vector widths follow the data: fp32 needs 4 bytes, odd bf16 rows get 2") {
  const DeviceTraits device = DeviceTraits::for_arch(90);
  auto widths = [&](const Problem& p) {
    std::set<int> vecs;
    for (const Config& c : rms().space(p, device)) vecs.insert(c.vec_bytes);
    return vecs;
  };
  CHECK(widths(problem(DType::bf16, 4096)) == std::set<int>{2, 4, 8, 16});
  CHECK(widths(problem(DType::f32, 4096)) == std::set<int>{4, 8, 16});
  CHECK(widths(problem(DType::bf16, 4545)) == std::set<int>{2});
  CHECK(widths(problem(DType::f16, 4546)) == std::set<int>{2, 4});
  CHECK(widths(problem(DType::bf16, 4096, true, 8)) == std::set<int>{2, 4, 8});
  // An fp32 element is always 4-byte aligned, whatever smaller alignment was reported.
  CHECK(widths(problem(DType::f32, 4096, true, 2)) == std::set<int>{4});
}

TEST_CASE("the widest rows still have a config") {
  for (int sm : kArchs) {
    const DeviceTraits device = DeviceTraits::for_arch(sm);
    for (DType dtype : kDTypes) {
      for (std::int64_t hidden : {16384, 32768, 49152, 65535, 65536}) {
        const Problem p = problem(dtype, hidden);
        CAPTURE(p.key());
        CHECK_FALSE(rms().space(p, device).empty());
        const Config h = rms().heuristic(p, device);
        CHECK(rms().invalid_reason(p, h, device) == "");
      }
    }
  }
}

TEST_CASE("invalid_reason explains each broken rule") {
  const DeviceTraits h100 = DeviceTraits::for_arch(90);
  const Problem aligned8 = problem(DType::bf16, 4096, true, 8);
  CHECK(rms().invalid_reason(aligned8, config(16, 128, 256), h100) ==
        "vec_bytes 16 exceeds the data alignment 8");
  CHECK(rms().invalid_reason(aligned8, config(8, 128, 256), h100) == "");

  const Problem bf16 = problem(DType::bf16, 4096);
  CHECK(rms().invalid_reason(bf16, config(16, 256, 128), h100) ==
        "cta_threads 128 is fewer than threads_per_row 256");
  CHECK(rms().invalid_reason(bf16, config(16, 128, 96), h100).find("cta_threads 96") == 0);
  CHECK(rms().invalid_reason(bf16, config(16, 48, 256), h100).find("threads_per_row 48") == 0);
  CHECK(rms().invalid_reason(bf16, config(12, 128, 256), h100).find("vec_bytes 12") == 0);

  const std::string odd =
      rms().invalid_reason(problem(DType::bf16, 4545), config(4, 128, 256), h100);
  CHECK(odd.find("4545") != std::string::npos);
  CHECK(odd.find("4-byte vectors") != std::string::npos);

  CHECK(rms()
            .invalid_reason(problem(DType::f32, 4096), config(2, 128, 256), h100)
            .find("narrower than one fp32 element") != std::string::npos);

  // 4096 bf16 over 32 threads is 128 elements a thread: past the register budget.
  CHECK(rms().invalid_reason(bf16, config(16, 32, 128), h100).find("register budget") !=
        std::string::npos);
  // 768 elements in 16-byte vectors are 96 vectors: 128 threads would leave some idle.
  CHECK(rms().invalid_reason(problem(DType::bf16, 768), config(16, 128, 128), h100).find("idle") !=
        std::string::npos);

  DeviceTraits small = h100;
  small.max_threads_per_block = 512;
  CHECK(rms().invalid_reason(bf16, config(16, 128, 1024), small).find("512 threads per block") !=
        std::string::npos);
  Config with_extra = config(16, 128, 256);
  with_extra.extra["cluster"] = 2;
  CHECK(rms().invalid_reason(bf16, with_extra, h100).find("cluster") != std::string::npos);
  CHECK(rms().invalid_reason(problem(DType::bf16, 0), config(16, 128, 256), h100).find("hidden") !=
        std::string::npos);
}

TEST_CASE("a CTA too large for the registers a row needs is invalid") {
  const DeviceTraits h100 = DeviceTraits::for_arch(90);
  // 16384 fp32 over 256 threads: 64 elements a thread, too many for the 64 registers a
  // 1024-thread CTA leaves each thread, fine for 256 threads.
  const Problem p = problem(DType::f32, 16384);
  CHECK(rms().invalid_reason(p, config(16, 256, 256), h100) == "");
  CHECK(rms().invalid_reason(p, config(16, 256, 1024), h100).find("registers") !=
        std::string::npos);
}

TEST_CASE("the heuristic is always in the space") {
  for (int sm : kArchs) {
    const DeviceTraits device = DeviceTraits::for_arch(sm);
    for (DType dtype : kDTypes) {
      for (std::int64_t hidden : kHiddens) {
        for (bool weight : {true, false}) {
          for (std::uint32_t align : kAligns) {
            const Problem p = problem(dtype, hidden, weight, align);
            CAPTURE(p.key());
            CAPTURE(sm);
            const Config h = rms().heuristic(p, device);
            const std::vector<Config> space = rms().space(p, device);
            CHECK(std::find(space.begin(), space.end(), h) != space.end());
            // The widest vector the data allows.
            CHECK(h.vec_bytes == space.front().vec_bytes);
            CHECK(h.cta_threads >= 128);
          }
        }
      }
    }
  }
}

TEST_CASE("the held heuristic picks 16-byte vectors and a moderate split for LLM hidden sizes") {
  const DeviceTraits h100 = DeviceTraits::for_arch(90);
  for (std::int64_t hidden : {2048, 3072, 4096, 5120, 8192}) {
    for (DType dtype : {DType::bf16, DType::f16}) {
      const Problem p = problem(dtype, hidden);
      CAPTURE(p.key());
      const Config h = norm().held_heuristic(p, h100);
      CHECK(h.vec_bytes == 16);
      const std::int64_t held = kiln::RmsNormFamily::elements_per_thread(p, h);
      CHECK(held >= 16);
      CHECK(held <= 48);
      CHECK(h.threads_per_row >= 32);
    }
  }
  // Rows whose vectors split evenly over 128 threads hold 32 elements a thread or fewer.
  for (std::int64_t hidden : {2048, 3072, 4096, 8192}) {
    const Problem p = problem(DType::bf16, hidden);
    CAPTURE(p.key());
    CHECK(kiln::RmsNormFamily::elements_per_thread(p, norm().held_heuristic(p, h100)) <= 32);
  }
  // Short rows are packed several to a CTA.
  const Config short_rows = norm().held_heuristic(problem(DType::bf16, 768), h100);
  CHECK(short_rows.rows_per_cta() >= 4);
}

TEST_CASE("the held heuristic halves a row split that would leave a quarter of its lanes idle") {
  const DeviceTraits h200 = DeviceTraits::for_arch(90);
  // 4544 bf16 = 568 vectors: 256 threads take 3 steps with 26% of the lane-steps idle, 128
  // threads take 5 steps with 11% idle (40 elements a thread).
  const Config falcon = norm().held_heuristic(problem(DType::bf16, 4544), h200);
  CHECK(falcon.threads_per_row == 128);
  CHECK(falcon.cta_threads == 128);
  // 2432 = 304 vectors: 128 threads idle 21% of 3 steps, 64 threads 5% of 5.
  CHECK(norm().held_heuristic(problem(DType::bf16, 2432), h200).threads_per_row == 64);
  // 14848 = 1856 vectors: 512 threads idle 9%; 256 would hold 64 elements, too many to keep.
  CHECK(norm().held_heuristic(problem(DType::bf16, 14848), h200).threads_per_row == 512);
  // An even split is kept.
  const Config even = norm().held_heuristic(problem(DType::bf16, 4096), h200);
  CHECK(even.threads_per_row == 128);
  CHECK(kiln::RmsNormFamily::elements_per_thread(problem(DType::bf16, 4096), even) == 32);
}

TEST_CASE("the heuristic forms the held split's row as each op's rows run fastest") {
  const DeviceTraits h200 = DeviceTraits::for_arch(90);
  auto heuristic = [&](Op op, std::int64_t hidden, const DeviceTraits& device) {
    const Problem p{op, DType::bf16, hidden, kiln::kNormWeight, 16};
    const auto& fam = dynamic_cast<const kiln::NormFamily&>(kiln::family(op));
    const Config held = fam.held_heuristic(p, device);
    const Config chosen = fam.heuristic(p, device);
    CHECK(fam.invalid_reason(p, chosen, device).empty());
    CHECK(held.extra.empty());
    return std::pair{held, chosen};
  };
  auto formed = [](Config config, const char* extra, int split_factor) {
    config.threads_per_row *= split_factor;
    config.cta_threads *= split_factor;
    config.extra[extra] = 1;
    return config;
  };
  for (std::int64_t hidden : {4096, 8192, 12288, 14848}) {
    CAPTURE(hidden);
    for (Op op : {Op::rms_norm, Op::adaln}) {
      auto [held, chosen] = heuristic(op, hidden, h200);
      CHECK(chosen == formed(held, "reread", 1));
    }
    // layer_norm stages rows of 16 KB of streams and more; a narrower one (4096 wide, no
    // affine: 8 KB) takes too few registers for staging to pay, and is held.
    auto [layer_held, layer_chosen] = heuristic(Op::layer_norm, hidden, h200);
    CHECK(layer_chosen == (hidden > 4096 ? formed(layer_held, "stage", 1) : layer_held));
    // fused_add_rms_norm re-reads in twice the threads a row, as many rows a CTA; it and
    // gated_adaln hold rows whose split already takes 512 threads (14848 wide).
    auto [add_held, add_chosen] = heuristic(Op::fused_add_rms_norm, hidden, h200);
    auto [gated_held, gated_chosen] = heuristic(Op::gated_adaln, hidden, h200);
    if (add_held.threads_per_row < 512) {
      CHECK(add_chosen == formed(add_held, "reread", 2));
      CHECK(gated_chosen == formed(gated_held, "reread", 1));
    } else {
      CHECK(hidden == 14848);
      CHECK(add_chosen == add_held);
      CHECK(gated_chosen == gated_held);
    }
  }
  // Where the space has no such row, the held one: rows under 4 KB, and a split that
  // leaves a thread one vector.
  auto [narrow_held, narrow_chosen] = heuristic(Op::rms_norm, 1536, h200);
  CHECK(narrow_chosen == narrow_held);
  auto [tiny_held, tiny_chosen] = heuristic(Op::rms_norm, 8, h200);
  CHECK(tiny_chosen == tiny_held);
  auto [tiny_add_held, tiny_add_chosen] = heuristic(Op::fused_add_rms_norm, 8, h200);
  CHECK(tiny_add_chosen == tiny_add_held);
  // Re-reading needs no sm_80 feature: sm_75 gets it too; staging needs cp.async, so sm_75's
  // layer_norm holds its rows.
  const DeviceTraits t4 = DeviceTraits::for_arch(75);
  auto [t4_held, t4_chosen] = heuristic(Op::rms_norm, 4096, t4);
  CHECK(t4_chosen.extra.count("reread") == 1);
  auto [t4_layer_held, t4_layer_chosen] = heuristic(Op::layer_norm, 8192, t4);
  CHECK(t4_layer_chosen == t4_layer_held);
}

TEST_CASE("name_expression spells the norm kernel with RMSNorm's features") {
  // Features: 2 is the weight (NormFeature::weight); no residual, gate or modulation.
  CHECK(rms().name_expression(problem(DType::bf16, 4096), config(16, 32, 128)) ==
        "kiln::norm<kiln::bf16, 4096, 16, 32, 128, 2u, false, false>");
  CHECK(rms().name_expression(problem(DType::f32, 7, false), config(4, 4, 64)) ==
        "kiln::norm<float, 7, 4, 4, 64, 0u, false, false>");
  Config persistent = config(2, 128, 256);
  persistent.extra["grid"] = 264;
  CHECK(rms().name_expression(problem(DType::f16, 4545), persistent) ==
        "kiln::norm<kiln::f16, 4545, 2, 128, 256, 2u, true, false>");
  Config reread = config(16, 256, 256);
  reread.extra["reread"] = 1;
  CHECK(rms().name_expression(problem(DType::bf16, 8192), reread) ==
        "kiln::norm<kiln::bf16, 8192, 16, 256, 256, 2u, false, true>");
}

TEST_CASE("re-read configs: every norm op, rows of 4 KB and several steps, never persistent") {
  const DeviceTraits h100 = DeviceTraits::for_arch(90);
  const Problem wide{Op::fused_add_rms_norm, DType::bf16, 8192, kiln::kNormWeight, 16};
  const auto& fused = dynamic_cast<const kiln::NormFamily&>(kiln::family(Op::fused_add_rms_norm));
  int rereads = 0;
  for (const Config& c : fused.space(wide, h100)) {
    if (c.extra.count("reread") == 0) continue;
    ++rereads;
    CHECK(c.extra.count("grid") == 0);
    CHECK(kiln::NormFamily::elements_per_thread(wide, c) / (c.vec_bytes / 2) >= 2);
    Config held = c;
    held.extra.erase("reread");
    // Holding a chunk of the row at a time needs no more registers than holding all of it.
    CHECK(fused.registers_per_thread(wide, c) <= fused.registers_per_thread(wide, held));
  }
  CHECK(rereads > 0);
  CHECK(fused.held_heuristic(wide, h100).extra.count("reread") == 0);
  Config reread = config(16, 256, 256);
  reread.extra["reread"] = 1;
  CHECK(fused.invalid_reason(wide, reread, h100).empty());
  // A plain row is re-read too (x in one go on each pass), with the registers of the row
  // held, at most; so is adaln's x, with per-token or per-sample scale and shift.
  const Problem plain = problem(DType::bf16, 8192);
  CHECK(rms().invalid_reason(plain, reread, h100).empty());
  Config held_plain = reread;
  held_plain.extra.erase("reread");
  const auto& rms_family = dynamic_cast<const kiln::NormFamily&>(rms());
  CHECK(rms_family.registers_per_thread(plain, reread) <=
        rms_family.registers_per_thread(plain, held_plain));
  const kiln::Family& adaln = kiln::family(Op::adaln);
  const Problem per_token{Op::adaln, DType::bf16, 8192, kiln::kNormTable | kiln::kNormPerToken, 16};
  const Problem per_sample{Op::adaln, DType::bf16, 8192, kiln::kNormTable, 16};
  CHECK(adaln.invalid_reason(per_token, reread, h100).empty());
  CHECK(adaln.invalid_reason(per_sample, reread, h100).empty());
  const auto has_reread = [](const std::vector<Config>& space) {
    return std::any_of(space.begin(), space.end(),
                       [](const Config& c) { return c.extra.count("reread") != 0; });
  };
  CHECK(has_reread(adaln.space(per_token, h100)));
  CHECK(has_reread(adaln.space(per_sample, h100)));
  CHECK(has_reread(rms().space(plain, h100)));
  CHECK(!has_reread(rms().space(problem(DType::bf16, 1536), h100)));
  Config short_row = config(16, 128, 128);
  short_row.extra["reread"] = 1;
  const Problem narrow{Op::fused_add_rms_norm, DType::bf16, 1536, kiln::kNormWeight, 16};
  CHECK(fused.invalid_reason(narrow, short_row, h100).find("4 KB") != std::string::npos);
  Config one_step = config(16, 1024, 1024);
  one_step.extra["reread"] = 1;
  CHECK(fused.invalid_reason(wide, one_step, h100).find("one vector") != std::string::npos);
  Config both = reread;
  both.extra["grid"] = 264;
  CHECK(!fused.invalid_reason(wide, both, h100).empty());
  Config two = config(16, 256, 256);
  two.extra["reread"] = 2;
  CHECK(fused.invalid_reason(wide, two, h100).find("neither 0 nor 1") != std::string::npos);
  const Problem in_place_layer{Op::gated_adaln, DType::bf16, 8192,
                               kiln::kNormLayer | kiln::kNormInPlace, 16};
  CHECK(kiln::family(Op::gated_adaln)
            .invalid_reason(in_place_layer, reread, h100)
            .find("in-place LayerNorm") != std::string::npos);
}

TEST_CASE("staged configs: sm_80 and later, 16 KB of row streams, several steps, one pass") {
  const DeviceTraits h100 = DeviceTraits::for_arch(90);
  const Problem wide = problem(DType::bf16, 8192);
  const auto& norm = dynamic_cast<const kiln::NormFamily&>(rms());
  int staged = 0;
  for (const Config& c : rms().space(wide, h100)) {
    if (c.extra.count("stage") == 0) {
      continue;
    }
    ++staged;
    CHECK(c.extra.size() == 1);
    CHECK(c.vec_bytes >= 4);
    Config held = c;
    held.extra.erase("stage");
    // A staged thread holds one step in registers; its row lives in shared memory.
    CHECK(norm.registers_per_thread(wide, c) <= norm.registers_per_thread(wide, held));
    CHECK(norm.resident_ctas(wide, c, h100) >= norm.resident_ctas(wide, held, h100));
    CHECK(norm.staged_smem_bytes(wide, held) == 0);
  }
  CHECK(staged > 0);
  CHECK(rms().heuristic(wide, h100).extra.count("stage") == 0);  // rms_norm's is re-read

  Config stage = config(16, 256, 256);
  stage.extra["stage"] = 1;
  CHECK(rms().invalid_reason(wide, stage, h100).empty());
  CHECK(rms().name_expression(wide, stage) ==
        "kiln::norm_staged<kiln::bf16, 8192, 16, 256, 256, 2u>");
  CHECK(rms().geometry(wide, stage, 1000).smem_bytes == 4 * 256 * 16);
  CHECK(rms()
            .invalid_reason(wide, stage, DeviceTraits::for_arch(75))
            .find("cp.async (sm_80 or later)") != std::string::npos);
  CHECK(rms().invalid_reason(problem(DType::bf16, 4096), stage, h100).find("16 KB") !=
        std::string::npos);
  Config one_step = config(16, 1024, 1024);
  one_step.extra["stage"] = 1;
  CHECK(rms().invalid_reason(wide, one_step, h100).find("one vector") != std::string::npos);
  // Each resident CTA holds its staged rows (and the driver's reserve) in shared memory.
  CHECK(norm.resident_ctas(wide, stage, h100) <= h100.smem_per_sm / (4 * 256 * 16 + 1024));
  Config persistent = stage;
  persistent.extra["grid"] = 264;
  CHECK(rms().invalid_reason(wide, persistent, h100).find("persistent grid") != std::string::npos);
  Config reread = stage;
  reread.extra["reread"] = 1;
  const Problem fused_wide{Op::fused_add_rms_norm, DType::bf16, 8192, kiln::kNormWeight, 16};
  CHECK(kiln::family(Op::fused_add_rms_norm)
            .invalid_reason(fused_wide, reread, h100)
            .find("nor re-read") != std::string::npos);
  Config two = stage;
  two.extra["stage"] = 2;
  CHECK(rms().invalid_reason(wide, two, h100).find("neither 0 nor 1") != std::string::npos);
  // A thread's share of a 14848-wide fp32 row in 4-byte vectors at 4 threads a row is too
  // many steps to hold, and too much to stage.
  CHECK(!rms()
             .invalid_reason(
                 problem(DType::f32, 14848),
                 [] {
                   Config c = config(4, 4, 1024);
                   c.extra["stage"] = 1;
                   return c;
                 }(),
                 h100)
             .empty());

  // The streams a row stages: gated_adaln per token stages x, y, gate, scale and shift;
  // per sample, only x and y (the modulation rows are read through L1).
  const auto& gated = dynamic_cast<const kiln::NormFamily&>(kiln::family(Op::gated_adaln));
  const Problem per_token{Op::gated_adaln, DType::bf16, 4096,
                          kiln::kNormTable | kiln::kNormPerToken, 16};
  const Problem per_sample{Op::gated_adaln, DType::bf16, 4096, kiln::kNormTable, 16};
  CHECK(gated.row_streams(per_token) == 5);
  CHECK(gated.row_streams(per_sample) == 2);
  CHECK(gated.geometry(per_token, stage, 7).smem_bytes == 5 * 2 * 256 * 16);
  CHECK(gated.invalid_reason(per_token, stage, h100).empty());
  // 2 streams of 8 KB: 16 KB, the smallest staged row.
  CHECK(gated.invalid_reason(per_sample, stage, h100).empty());
}

TEST_CASE("clustered configs: sm_90, 16 KB or more of row streams, one row per CTA, one pass") {
  const DeviceTraits h100 = DeviceTraits::for_arch(90);
  const Problem wide = problem(DType::bf16, 8192);
  int clustered = 0;
  for (const Config& c : rms().space(wide, h100)) {
    const auto cluster = c.extra.find("cluster");
    if (cluster == c.extra.end()) {
      continue;
    }
    ++clustered;
    CHECK(c.extra.size() == 1);
    CHECK(c.threads_per_row == c.cta_threads);
    // A thread holds its share of the row over the whole cluster's threads.
    Config alone = c;
    alone.extra.erase("cluster");
    CHECK(kiln::NormFamily::elements_per_thread(wide, c) * cluster->second ==
          kiln::NormFamily::elements_per_thread(wide, alone));
  }
  CHECK(clustered > 0);
  CHECK(rms().heuristic(wide, h100).extra.count("cluster") == 0);
  for (int sm : {75, 80}) {
    for (const Config& c : rms().space(wide, DeviceTraits::for_arch(sm))) {
      CHECK(c.extra.count("cluster") == 0);
    }
  }

  Config four = config(16, 256, 256);
  four.extra["cluster"] = 4;
  CHECK(rms().invalid_reason(wide, four, h100).empty());
  CHECK(rms().name_expression(wide, four) ==
        "kiln::norm_cluster<kiln::bf16, 8192, 16, 256, 4, 2u>");
  CHECK(rms().geometry(wide, four, 5).grid[0] == 20);
  CHECK(rms().geometry(wide, four, 0).grid[0] == 4);
  CHECK_THROWS_WITH_AS(rms().geometry(wide, four, std::int64_t{1} << 30),
                       doctest::Contains("rows: expected at most 536870911 rows for a cluster of 4 "
                                         "CTAs, got 1073741824"),
                       kiln::ArgumentError);
  CHECK(rms().invalid_reason(wide, four, DeviceTraits::for_arch(80)) ==
        "a cluster of CTAs needs sm_90 or later, not sm_80");
  CHECK(rms().invalid_reason(problem(DType::bf16, 8184), four, h100).find("under 16 KB") !=
        std::string::npos);
  Config three = four;
  three.extra["cluster"] = 3;
  CHECK(rms().invalid_reason(wide, three, h100) == "cluster 3 is not 2, 4 or 8");
  Config shared = config(16, 128, 256);
  shared.extra["cluster"] = 2;
  CHECK(rms().invalid_reason(wide, shared, h100).find("must equal cta_threads (256)") !=
        std::string::npos);
  Config idle = config(16, 512, 512);
  idle.extra["cluster"] = 4;
  CHECK(rms().invalid_reason(wide, idle, h100) ==
        "a cluster of 4 CTAs of 512 threads leaves threads idle: a row has only 1024 vectors "
        "of 16 bytes");
  Config persistent = four;
  persistent.extra["grid"] = 264;
  CHECK(rms().invalid_reason(wide, persistent, h100).find("neither prefetched") !=
        std::string::npos);
  // The bytes a row streams count, not its width: per-token gated_adaln 2048 wide streams
  // five 4 KB rows (x, y, gate, scale, shift); per sample, two (x and y).
  const kiln::Family& gated = kiln::family(Op::gated_adaln);
  const Problem per_token{Op::gated_adaln, DType::bf16, 2048,
                          kiln::kNormTable | kiln::kNormPerToken, 16};
  const Problem per_sample{Op::gated_adaln, DType::bf16, 2048, kiln::kNormTable, 16};
  Config two = config(16, 128, 128);
  two.extra["cluster"] = 2;
  CHECK(gated.invalid_reason(per_token, two, h100).empty());
  CHECK(gated.invalid_reason(per_sample, two, h100).find("under 16 KB") != std::string::npos);
  // The fast search measures clusters only while the rows leave SMs without one.
  CHECK(rms().worth_measuring(wide, four, h100, 1));
  CHECK(rms().worth_measuring(wide, four, h100, h100.sm_count));
  CHECK(!rms().worth_measuring(wide, four, h100, h100.sm_count + 1));
  CHECK(rms().worth_measuring(wide, config(16, 256, 256), h100, 32768));
  // ... or, for a pair of CTAs, while a row streams at least 64 KB: per-token gated_adaln
  // 8192 wide streams five 16 KB rows, 4544 wide five of 9 KB.
  const Problem wide_gated{Op::gated_adaln, DType::bf16, 8192,
                           kiln::kNormTable | kiln::kNormPerToken, 16};
  const Problem narrower_gated{Op::gated_adaln, DType::bf16, 4544,
                               kiln::kNormTable | kiln::kNormPerToken, 16};
  Config pair = config(16, 256, 256);
  pair.extra["cluster"] = 2;
  Config quad = config(16, 256, 256);
  quad.extra["cluster"] = 4;
  CHECK(gated.invalid_reason(wide_gated, pair, h100).empty());
  CHECK(gated.worth_measuring(wide_gated, pair, h100, 32768));
  CHECK(!gated.worth_measuring(wide_gated, quad, h100, 32768));
  CHECK(!gated.worth_measuring(narrower_gated, pair, h100, 32768));
  CHECK(gated.worth_measuring(narrower_gated, pair, h100, 1));
}

TEST_CASE("geometry covers every row with no idle CTA") {
  const DeviceTraits h100 = DeviceTraits::for_arch(90);
  for (const Problem& p : {problem(DType::bf16, 4096), problem(DType::f32, 768, false),
                           problem(DType::bf16, 4545), problem(DType::bf16, 14848)}) {
    for (const Config& c : rms().space(p, h100)) {
      for (std::int64_t rows : {1, 7, 4096, 100000}) {
        CAPTURE(c.key());
        CAPTURE(rows);
        const kiln::LaunchGeometry g = rms().geometry(p, c, rows);
        const std::int64_t rows_per_cta = c.cta_threads / c.threads_per_row;
        if (const auto cluster = c.extra.find("cluster"); cluster != c.extra.end()) {
          // One row per cluster of CTAs, every row its own.
          CHECK(std::int64_t{g.grid[0]} == rows * cluster->second);
          CHECK(g.smem_bytes == 0);
          continue;
        }
        CHECK(g.block[0] == static_cast<std::uint32_t>(c.cta_threads));
        CHECK(g.block[1] == 1);
        CHECK(g.block[2] == 1);
        CHECK(g.grid[1] == 1);
        CHECK(g.grid[2] == 1);
        const auto cap = c.extra.find("grid");
        if (cap == c.extra.end()) {
          CHECK(std::int64_t{g.grid[0]} * rows_per_cta >= rows);
          CHECK((std::int64_t{g.grid[0]} - 1) * rows_per_cta < rows);
        } else {  // a persistent grid: at most its cap, and never a CTA without a row
          CHECK(std::int64_t{g.grid[0]} <= cap->second);
          CHECK((std::int64_t{g.grid[0]} - 1) * rows_per_cta < rows);
          CHECK((std::int64_t{g.grid[0]} == cap->second ||
                 std::int64_t{g.grid[0]} * rows_per_cta >= rows));
        }
        const auto stage = c.extra.find("stage");
        if (stage == c.extra.end()) {
          CHECK(g.smem_bytes == 0);
        } else {  // every row stream of every thread's steps: x only, for RMSNorm
          const std::int64_t vec_elems = c.vec_bytes / static_cast<int>(kiln::dtype_size(p.dtype));
          CHECK(std::int64_t{g.smem_bytes} == kiln::NormFamily::elements_per_thread(p, c) /
                                                  vec_elems * c.cta_threads * c.vec_bytes);
        }
      }
    }
  }
}

TEST_CASE("geometry stays launchable for no rows and for more rows than a grid can hold") {
  const Problem p = problem(DType::bf16, 4096);
  const Config c = config(16, 128, 128);
  CHECK(rms().geometry(p, c, 0).grid[0] == 1);
  // One row per CTA and 2^40 rows: the grid is capped and the kernel's row loop (which the
  // host asks for past 2^31 - 1 rows) covers the rest.
  const std::int64_t huge = std::int64_t{1} << 40;
  REQUIRE(kiln::NormFamily::needs_row_loop(huge));
  Problem looped = p;
  looped.flags |= kiln::kNormRowLoop;
  CHECK(rms().geometry(looped, c, huge).grid[0] == 0x7fffffffu);
  CHECK(rms().name_expression(looped, c) ==
        "kiln::norm<kiln::bf16, 4096, 16, 128, 128, " +
            std::to_string(kiln::NormFeature::weight | kiln::NormFeature::row_loop) +
            "u, false, false>");
  // Without it the one-pass kernel would leave the rows past its grid unwritten.
  CHECK_THROWS_WITH_AS(rms().geometry(p, c, huge), doctest::Contains("need the row loop (flag 64)"),
                       kiln::Error);
  // Two rows a CTA: 2^31 - 1 rows still fit one pass.
  CHECK_FALSE(kiln::NormFamily::needs_row_loop(0x7fffffff));
  CHECK(kiln::NormFamily::needs_row_loop(std::int64_t{0x7fffffff} + 1));
  CHECK(rms().geometry(p, config(16, 128, 256), 0x7fffffff).grid[0] == 0x40000000u);
}

TEST_CASE("buffers and bytes_moved describe a stand-alone run") {
  const auto with_weight = rms().buffers(problem(DType::bf16, 4096), 10);
  REQUIRE(with_weight.size() == 3);
  CHECK(with_weight[0].name == "x");
  CHECK(with_weight[0].elements == 40960);
  CHECK_FALSE(with_weight[0].is_output);
  CHECK(with_weight[1].name == "weight");
  CHECK(with_weight[1].elements == 4096);
  CHECK_FALSE(with_weight[1].is_output);
  CHECK(with_weight[2].name == "out");
  CHECK(with_weight[2].elements == 40960);
  CHECK(with_weight[2].is_output);
  for (const auto& b : with_weight) CHECK(b.dtype == DType::bf16);

  const auto without = rms().buffers(problem(DType::f32, 768, false), 3);
  REQUIRE(without.size() == 2);
  CHECK(without[0].name == "x");
  CHECK(without[1].name == "out");
  CHECK(without[1].dtype == DType::f32);

  // bf16: x read and out written, 10 rows of 4096, plus the weight once.
  CHECK(rms().bytes_moved(problem(DType::bf16, 4096), 10) == (2 * 10 * 4096 + 4096) * 2);
  CHECK(rms().bytes_moved(problem(DType::f32, 768, false), 3) == 2 * 3 * 768 * 4);
  CHECK_THROWS_AS(rms().buffers(problem(DType::bf16, 4096), -1), kiln::ArgumentError);
}

TEST_CASE("pack_params lays out the plain norm's parameters for the buffers' addresses") {
  const Problem p = problem(DType::bf16, 4096);
  const std::uint64_t addresses[] = {0x7f0000001000ull, 0x7f0000200000ull, 0x7f0000300000ull};
  const std::vector<std::byte> bytes = rms().pack_params(p, 123, addresses);
  REQUIRE(bytes.size() == sizeof(kiln::NormPlainArgs));
  kiln::NormPlainArgs params;
  std::memcpy(&params, bytes.data(), sizeof(params));
  CHECK(reinterpret_cast<std::uintptr_t>(params.x) == addresses[0]);
  CHECK(reinterpret_cast<std::uintptr_t>(params.weight) == addresses[1]);
  CHECK(reinterpret_cast<std::uintptr_t>(params.out) == addresses[2]);
  CHECK(params.rows == 123);
  CHECK(params.x_row_stride == 4096);
  CHECK(params.out_row_stride == 4096);
  CHECK(params.eps == doctest::Approx(1e-6f));
  CHECK(rms().pack_params(p, 123, addresses) == bytes);

  const Problem no_weight = problem(DType::f32, 768, false);
  const std::uint64_t two[] = {0x1000, 0x2000};
  const std::vector<std::byte> packed = rms().pack_params(no_weight, 5, two);
  std::memcpy(&params, packed.data(), sizeof(params));
  CHECK(reinterpret_cast<std::uintptr_t>(params.x) == 0x1000);
  CHECK(params.weight == nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(params.out) == 0x2000);
  CHECK(params.x_row_stride == 768);

  CHECK_THROWS_AS(rms().pack_params(p, 1, two), kiln::Error);
  CHECK_THROWS_AS(rms().pack_params(no_weight, 1, addresses), kiln::Error);
  // The buffers() order is the order pack_params reads addresses in.
  CHECK(rms().buffers(p, 1).size() == std::size(addresses));
  CHECK(rms().buffers(no_weight, 1).size() == std::size(two));
}
