#include "jit/model_config.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "cache/error.h"
#include "templates/family.h"
#include "templates/norm_family.h"
#include "templates/rope_family.h"

using kiln::Op;

namespace {

// Qwen3-Next-80B-A3B's config.json, the keys kiln reads.
nlohmann::json qwen3_next() {
  return {{"model_type", "qwen3_next"},
          {"hidden_size", 2048},
          {"intermediate_size", 5120},
          {"shared_expert_intermediate_size", 512},
          {"num_attention_heads", 16},
          {"num_key_value_heads", 2},
          {"head_dim", 256},
          {"partial_rotary_factor", 0.25},
          {"linear_value_head_dim", 128}};
}

}  // namespace

TEST_CASE("a partial rotation gives RoPE's rotary dim, as transformers sizes its table") {
  const kiln::jit::ModelShape next = kiln::jit::read_model_config(qwen3_next());
  CHECK(next.rotary_dim == 64);
  CHECK(next.head_norm_layout == 0u);  // per-head q/k norms fused with the rotation
  CHECK(next.rope.find("the first 64 of 256 columns") != std::string::npos);
  CHECK(next.ops.at(Op::swiglu) == std::vector<std::int64_t>{5120, 512});
  CHECK(next.ops.at(Op::rms_norm) == std::vector<std::int64_t>{2048, 256});
  // The gated RMSNorm that closes each linear-attention value head.
  CHECK(next.ops.at(Op::rms_norm_gated) == std::vector<std::int64_t>{128});

  // Phi-4-mini: 0.75 of 128 columns; transformers 5's rope_parameters; GPT-NeoX's rotary_pct.
  nlohmann::json phi = {{"model_type", "phi3"},      {"hidden_size", 3072},
                        {"intermediate_size", 8192}, {"num_attention_heads", 24},
                        {"num_key_value_heads", 8},  {"partial_rotary_factor", 0.75}};
  CHECK(kiln::jit::read_model_config(phi).rotary_dim == 96);
  CHECK(!kiln::jit::read_model_config(phi).head_norm_layout.has_value());
  phi.erase("partial_rotary_factor");
  CHECK(kiln::jit::read_model_config(phi).rotary_dim == 0);
  phi["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
  CHECK(kiln::jit::read_model_config(phi).rotary_dim == 64);
  phi.erase("rope_parameters");
  phi["rotary_pct"] = 0.25;
  CHECK(kiln::jit::read_model_config(phi).rotary_dim == 32);
  phi["rotary_pct"] = 1.0;
  CHECK(kiln::jit::read_model_config(phi).rotary_dim == 0);

  phi["rotary_pct"] = 1.5;
  CHECK_THROWS_WITH_AS(kiln::jit::read_model_config(phi),
                       "kiln prewarm: config.json: \"rotary_pct\": expected a number in (0, 1], "
                       "got 1.5",
                       kiln::Error);
  phi["rotary_pct"] = 0.01;  // 1.28 columns
  CHECK_THROWS_WITH_AS(kiln::jit::read_model_config(phi),
                       doctest::Contains("rotates 1 columns; RoPE rotates pairs"), kiln::Error);
}

TEST_CASE("models that hand RoPE another table or a slice prewarm the problems they call") {
  // GPT-OSS: a [.., D / 2] table, one angle a pair, of the model's dtype.
  const nlohmann::json gpt_oss = {{"model_type", "gpt_oss"},   {"hidden_size", 2880},
                                  {"intermediate_size", 2880}, {"num_attention_heads", 64},
                                  {"num_key_value_heads", 8},  {"head_dim", 64}};
  const kiln::jit::ModelShape oss = kiln::jit::read_model_config(gpt_oss);
  CHECK(oss.rope_table_flags == kiln::kRopeHalfTable);
  CHECK(oss.rotary_dim == 0);
  // GLM-4: interleaved pairs over the first half of each head, half the table's columns read.
  const nlohmann::json glm4 = {{"model_type", "glm4"},        {"hidden_size", 4096},
                               {"intermediate_size", 13696},  {"num_attention_heads", 32},
                               {"num_key_value_heads", 2},    {"head_dim", 128},
                               {"partial_rotary_factor", 0.5}};
  const kiln::jit::ModelShape glm = kiln::jit::read_model_config(glm4);
  CHECK(glm.rope_table_flags == (kiln::kRopeInterleaved | kiln::kRopeHalfTable));
  CHECK(glm.rotary_dim == 64);
  const auto problems = kiln::family(Op::rope).common_problems(
      kiln::DType::bf16, 128, kiln::jit::prewarm_model(glm, false));
  const auto has = [&](std::uint32_t flags) {
    return std::any_of(problems.begin(), problems.end(),
                       [&](const kiln::Problem& p) { return p.flags == flags && p.aux == 64; });
  };
  CHECK(has(kiln::kRopeInterleaved | kiln::kRopeHalfTable | kiln::kRopeHeadsEven));
  CHECK(has(kiln::kRopeInterleaved | kiln::kRopeHalfTable | kiln::kRopeHeadsEven |
            kiln::kRopePositionsInner));
  // Phi-2 rotates the slice its attention cuts off as a whole head: RoPE at 32 wide, aux 0.
  const nlohmann::json phi2 = {{"model_type", "phi"},
                               {"hidden_size", 2560},
                               {"intermediate_size", 10240},
                               {"num_attention_heads", 32},
                               {"partial_rotary_factor", 0.4}};
  const kiln::jit::ModelShape phi = kiln::jit::read_model_config(phi2);
  CHECK(phi.ops.at(Op::rope) == std::vector<std::int64_t>{32});
  CHECK(phi.rotary_dim == 0);
}

TEST_CASE("a multimodal config's language model is read from its text_config") {
  const nlohmann::json qwen3_5 = {
      {"model_type", "qwen3_5"},
      {"vision_config", {{"hidden_size", 1152}, {"depth", 27}}},
      {"text_config",
       {{"model_type", "qwen3_5_text"},
        {"hidden_size", 4096},
        {"intermediate_size", 12288},
        {"num_attention_heads", 16},
        {"num_key_value_heads", 4},
        {"head_dim", 256},
        {"rope_parameters", {{"rope_type", "default"}, {"partial_rotary_factor", 0.25}}}}}};
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(qwen3_5);
  CHECK(model.kind == "qwen3_5_text");
  CHECK(model.hidden == 4096);
  CHECK(model.rotary_dim == 64);
  CHECK(model.head_norm_layout == 0u);
  CHECK_THROWS_AS(kiln::jit::read_model_config(nlohmann::json{{"text_config", {{"depth", 2}}}}),
                  kiln::Error);
}

TEST_CASE("the model's rotary dim reaches every RoPE problem prewarm compiles") {
  const kiln::jit::ModelShape next = kiln::jit::read_model_config(qwen3_next());
  for (bool training : {false, true}) {
    const kiln::PrewarmModel model = kiln::jit::prewarm_model(next, training);
    CHECK(model.rotary_dim == 64);
    CHECK(model.heads_q == 16);
    CHECK(model.training == training);
    const auto problems = kiln::family(Op::rope).common_problems(kiln::DType::bf16, 256, model);
    REQUIRE(!problems.empty());
    bool fused = false;
    for (const kiln::Problem& p : problems) {
      CHECK(p.aux == 64);
      CHECK_NOTHROW(kiln::family(Op::rope).check(p));
      fused = fused || (p.flags & kiln::kRopeHeadNorm) != 0;
    }
    CHECK(fused);
  }
  // The whole head: aux 0, the problem a whole-head call has.
  kiln::PrewarmModel whole;
  whole.rotary_dim = 128;
  for (const kiln::Problem& p :
       kiln::family(Op::rope).common_problems(kiln::DType::bf16, 128, whole)) {
    CHECK(p.aux == 0);
  }
}

TEST_CASE("a Mamba-2 hybrid's gated norm is prewarmed as its patch calls it: the gate first") {
  // Bamba-9B: 8192 channels (mamba_expand 2 x hidden 4096), one group: the whole row, weighted.
  nlohmann::json bamba = {{"model_type", "bamba"},      {"hidden_size", 4096},
                          {"intermediate_size", 14336}, {"num_attention_heads", 32},
                          {"num_key_value_heads", 8},   {"mamba_expand", 2},
                          {"mamba_n_groups", 1}};
  kiln::jit::ModelShape model = kiln::jit::read_model_config(bamba);
  CHECK(model.ops.at(Op::rms_norm_gated) == std::vector<std::int64_t>{8192});
  CHECK(model.gated_norm_flags == (kiln::kNormGateFirst | kiln::kNormWeight));
  const auto problems =
      kiln::family(Op::rms_norm_gated)
          .common_problems(kiln::DType::bf16, 8192, kiln::jit::prewarm_model(model, false));
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].flags == (kiln::kNormGateFirst | kiln::kNormWeight));

  // Nemotron-H: 128 heads of 64 in 8 groups: rows of 1024, the weight applied after the call.
  nlohmann::json nemotron = {{"model_type", "nemotron_h"}, {"hidden_size", 4096},
                             {"intermediate_size", 21504}, {"num_attention_heads", 32},
                             {"num_key_value_heads", 8},   {"mamba_num_heads", 128},
                             {"mamba_head_dim", 64},       {"n_groups", 8}};
  model = kiln::jit::read_model_config(nemotron);
  CHECK(model.ops.at(Op::rms_norm_gated) == std::vector<std::int64_t>{1024});
  CHECK(model.gated_norm_flags == kiln::kNormGateFirst);

  // A model with neither a linear attention nor a Mamba mixer has no gated norm; Qwen3-Next's is
  // the linear attention's form (the default flags).
  nlohmann::json llama = {{"model_type", "llama"},
                          {"hidden_size", 4096},
                          {"intermediate_size", 14336},
                          {"num_attention_heads", 32}};
  CHECK(kiln::jit::read_model_config(llama).ops.count(Op::rms_norm_gated) == 0);
  CHECK(!kiln::jit::read_model_config(qwen3_next()).gated_norm_flags.has_value());
}
