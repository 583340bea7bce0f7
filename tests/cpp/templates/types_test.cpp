#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "cache/error.h"
#include "templates/types.h"

using kiln::Config;
using kiln::DType;
using kiln::Op;
using kiln::Problem;

TEST_CASE("dtype names, CUDA types and sizes") {
  CHECK(kiln::dtype_name(DType::f32) == "fp32");
  CHECK(kiln::dtype_name(DType::f16) == "fp16");
  CHECK(kiln::dtype_name(DType::bf16) == "bf16");
  CHECK(kiln::dtype_cuda_type(DType::f32) == "float");
  CHECK(kiln::dtype_cuda_type(DType::f16) == "kiln::f16");
  CHECK(kiln::dtype_cuda_type(DType::bf16) == "kiln::bf16");
  CHECK(kiln::dtype_size(DType::f32) == 4);
  CHECK(kiln::dtype_size(DType::f16) == 2);
  CHECK(kiln::dtype_size(DType::bf16) == 2);
}

TEST_CASE("parse_dtype accepts kiln, torch and C spellings and nothing else") {
  for (const char* text : {"fp32", "float32", "float"})
    CHECK(kiln::parse_dtype(text) == DType::f32);
  for (const char* text : {"fp16", "float16", "half"}) CHECK(kiln::parse_dtype(text) == DType::f16);
  for (const char* text : {"bf16", "bfloat16"}) CHECK(kiln::parse_dtype(text) == DType::bf16);
  for (const char* text : {"", "FP32", "fp8", "bf", "float64", "int8"}) {
    CHECK_FALSE(kiln::parse_dtype(text).has_value());
  }
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    CHECK(kiln::parse_dtype(kiln::dtype_name(dtype)) == dtype);
  }
}

TEST_CASE("op names round-trip") {
  CHECK(kiln::op_name(Op::rms_norm) == "rms_norm");
  CHECK(kiln::parse_op("rms_norm") == Op::rms_norm);
  CHECK_FALSE(kiln::parse_op("softmax").has_value());
  CHECK_FALSE(kiln::parse_op("").has_value());
  for (Op op :
       {Op::rms_norm, Op::fused_add_rms_norm, Op::layer_norm, Op::adaln, Op::gated_adaln, Op::rope,
        Op::rope_3d, Op::rms_norm_rope, Op::swiglu, Op::geglu, Op::gelu, Op::gated_residual,
        Op::rms_norm_gated, Op::clamped_swiglu, Op::clamped_swiglu_backward}) {
    CHECK(kiln::parse_op(kiln::op_name(op)) == op);
  }
}

TEST_CASE("Problem::aux appears in the key and JSON only when set") {
  Problem problem{Op::rope, kiln::DType::bf16, 128, 0u, 16};
  CHECK(problem.key() == "rope.bf16.h128.f0.a16");
  CHECK_FALSE(nlohmann::json(problem).contains("aux"));
  problem.aux = 64;
  CHECK(problem.key() == "rope.bf16.h128.f0.a16.x64");
  CHECK(nlohmann::json(problem).get<Problem>() == problem);
  CHECK(std::hash<Problem>{}(problem) !=
        std::hash<Problem>{}(Problem{Op::rope, kiln::DType::bf16, 128, 0u, 16}));
}

TEST_CASE("Problem::key is the documented text form") {
  Problem problem{Op::rms_norm, DType::bf16, 4096, 1, 16};
  CHECK(problem.key() == "rms_norm.bf16.h4096.f1.a16");
  problem.dtype = DType::f32;
  problem.hidden = 7;
  problem.flags = 0;
  problem.align = 4;
  CHECK(problem.key() == "rms_norm.fp32.h7.f0.a4");
}

TEST_CASE("Config::key lists extras in name order") {
  Config config;
  config.vec_bytes = 16;
  config.threads_per_row = 32;
  config.cta_threads = 128;
  CHECK(config.key() == "v16.t32.c128");
  config.extra["zeta"] = -3;
  config.extra["alpha"] = 2;
  CHECK(config.key() == "v16.t32.c128.alpha=2.zeta=-3");
  CHECK(config.rows_per_cta() == 4);
}

TEST_CASE("Config JSON round-trips, extras included") {
  Config config;
  config.vec_bytes = 8;
  config.threads_per_row = 64;
  config.cta_threads = 256;
  config.extra["persistent"] = 1;
  const nlohmann::json j = config;
  CHECK(j.at("vec_bytes") == 8);
  CHECK(j.at("threads_per_row") == 64);
  CHECK(j.at("cta_threads") == 256);
  const Config back = nlohmann::json::parse(j.dump()).get<Config>();
  CHECK(back == config);
  CHECK(back.key() == config.key());

  const Config plain =
      nlohmann::json{{"vec_bytes", 4}, {"threads_per_row", 4}, {"cta_threads", 64}}.get<Config>();
  CHECK(plain.vec_bytes == 4);
  CHECK(plain.extra.empty());
}

TEST_CASE("Problem JSON round-trips with names for op and dtype") {
  const Problem problem{Op::rms_norm, DType::f16, 5120, 1, 8};
  const nlohmann::json j = problem;
  CHECK(j.at("op") == "rms_norm");
  CHECK(j.at("dtype") == "fp16");
  CHECK(j.at("hidden") == 5120);
  const Problem back = nlohmann::json::parse(j.dump()).get<Problem>();
  CHECK(back == problem);
  CHECK(back.key() == problem.key());
}

TEST_CASE("bad Config JSON throws kiln::Error naming the field") {
  const nlohmann::json good = {{"vec_bytes", 16}, {"threads_per_row", 32}, {"cta_threads", 128}};
  auto with = [&](const char* field, nlohmann::json value) {
    nlohmann::json j = good;
    j[field] = std::move(value);
    return j;
  };
  auto without = [&](const char* field) {
    nlohmann::json j = good;
    j.erase(field);
    return j;
  };
  CHECK_THROWS_WITH_AS(without("vec_bytes").get<Config>(), doctest::Contains("vec_bytes"),
                       kiln::Error);
  CHECK_THROWS_WITH_AS(with("threads_per_row", "32").get<Config>(),
                       doctest::Contains("threads_per_row"), kiln::Error);
  CHECK_THROWS_AS(with("cta_threads", 1.5).get<Config>(), kiln::Error);
  CHECK_THROWS_AS(with("cta_threads", -128).get<Config>(), kiln::Error);
  CHECK_THROWS_AS(with("vec_bytes", 1ll << 40).get<Config>(), kiln::Error);
  CHECK_THROWS_AS(with("extra", nlohmann::json::array()).get<Config>(), kiln::Error);
  CHECK_THROWS_WITH_AS(with("extra", {{"cluster", "two"}}).get<Config>(),
                       doctest::Contains("cluster"), kiln::Error);
  CHECK_THROWS_AS(nlohmann::json::array({16, 32, 128}).get<Config>(), kiln::Error);
  CHECK_THROWS_AS(nlohmann::json(nullptr).get<Config>(), kiln::Error);
}

TEST_CASE("bad Problem JSON throws kiln::Error naming the field") {
  const nlohmann::json good = {
      {"op", "rms_norm"}, {"dtype", "bf16"}, {"hidden", 4096}, {"flags", 1}, {"align", 16}};
  auto with = [&](const char* field, nlohmann::json value) {
    nlohmann::json j = good;
    j[field] = std::move(value);
    return j;
  };
  CHECK(good.get<Problem>() == Problem{Op::rms_norm, DType::bf16, 4096, 1, 16});
  CHECK(with("dtype", "bfloat16").get<Problem>().dtype == DType::bf16);
  CHECK_THROWS_WITH_AS(with("op", "softmax").get<Problem>(), doctest::Contains("softmax"),
                       kiln::Error);
  CHECK_THROWS_WITH_AS(with("dtype", "fp8").get<Problem>(), doctest::Contains("fp8"), kiln::Error);
  CHECK_THROWS_AS(with("dtype", 2).get<Problem>(), kiln::Error);
  CHECK_THROWS_WITH_AS(with("hidden", 0).get<Problem>(), doctest::Contains("hidden"), kiln::Error);
  CHECK_THROWS_AS(with("hidden", "4096").get<Problem>(), kiln::Error);
  CHECK_THROWS_AS(with("flags", -1).get<Problem>(), kiln::Error);
  CHECK_THROWS_AS(with("flags", 1ll << 33).get<Problem>(), kiln::Error);
  CHECK_THROWS_WITH_AS(with("align", 12).get<Problem>(), doctest::Contains("align"), kiln::Error);
  CHECK_THROWS_AS(with("align", 32).get<Problem>(), kiln::Error);
  nlohmann::json missing = good;
  missing.erase("hidden");
  CHECK_THROWS_WITH_AS(missing.get<Problem>(), doctest::Contains("hidden"), kiln::Error);
  CHECK_THROWS_AS(nlohmann::json("rms_norm").get<Problem>(), kiln::Error);
}

TEST_CASE("DeviceTraits::for_arch knows T4, A100 and H100") {
  const auto t4 = kiln::DeviceTraits::for_arch(75);
  CHECK(t4.sm == 75);
  CHECK(t4.sm_count == 40);
  CHECK(t4.max_threads_per_sm == 1024);
  CHECK(t4.smem_per_block_optin == 64 * 1024);
  CHECK(t4.l2_bytes == 4 * 1024 * 1024);

  const auto a100 = kiln::DeviceTraits::for_arch(80);
  CHECK(a100.sm_count == 108);
  CHECK(a100.max_threads_per_sm == 2048);
  CHECK(a100.smem_per_block_optin == 163 * 1024);
  CHECK(a100.l2_bytes == 40 * 1024 * 1024);

  const auto h100 = kiln::DeviceTraits::for_arch(90);
  CHECK(h100.sm_count == 132);
  CHECK(h100.smem_per_block_optin == 227 * 1024);
  CHECK(h100.l2_bytes == 50 * 1024 * 1024);

  for (int sm : {86, 89}) {
    const auto traits = kiln::DeviceTraits::for_arch(sm);
    CHECK(traits.sm == sm);
    CHECK(traits.max_threads_per_block == 1024);
    CHECK(traits.smem_per_block_optin <= traits.smem_per_sm);
  }
}

TEST_CASE("DeviceTraits::for_arch falls back to the nearest lower known arch") {
  const auto sm87 = kiln::DeviceTraits::for_arch(87);
  const auto sm86 = kiln::DeviceTraits::for_arch(86);
  CHECK(sm87.sm == 87);
  CHECK(sm87.sm_count == sm86.sm_count);
  CHECK(sm87.l2_bytes == sm86.l2_bytes);

  const auto sm100 = kiln::DeviceTraits::for_arch(100);
  const auto sm90 = kiln::DeviceTraits::for_arch(90);
  CHECK(sm100.sm == 100);
  CHECK(sm100.sm_count == sm90.sm_count);
  CHECK(sm100.smem_per_block_optin == sm90.smem_per_block_optin);

  CHECK(kiln::DeviceTraits::for_arch(78).sm_count == kiln::DeviceTraits::for_arch(75).sm_count);
  CHECK_THROWS_AS(kiln::DeviceTraits::for_arch(70), kiln::ArgumentError);
}

TEST_CASE("std::hash<Problem> separates problems that differ in one field") {
  const Problem base{Op::rms_norm, DType::bf16, 4096, 1, 16};
  const std::hash<Problem> hash;
  Problem other = base;
  other.hidden = 4097;
  CHECK(hash(other) != hash(base));
  other = base;
  other.dtype = DType::f16;
  CHECK(hash(other) != hash(base));
  other = base;
  other.flags = 0;
  CHECK(hash(other) != hash(base));
  other = base;
  other.align = 8;
  CHECK(hash(other) != hash(base));
}
