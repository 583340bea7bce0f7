#include "jit/model_config.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cache/error.h"
#include "jit/prewarm.h"
#include "templates/elementwise_family.h"
#include "templates/family.h"
#include "templates/norm_family.h"
#include "templates/rms_norm_rope_family.h"
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

TEST_CASE("Llama 4 prewarms its dense MLP's width and its q/k head norms") {
  const nlohmann::json llama4 = {{"model_type", "llama4_text"},
                                 {"hidden_size", 5120},
                                 {"intermediate_size", 8192},
                                 {"intermediate_size_mlp", 16384},
                                 {"num_attention_heads", 40},
                                 {"num_key_value_heads", 8},
                                 {"head_dim", 128},
                                 {"num_local_experts", 16},
                                 {"use_qk_norm", true}};
  const kiln::jit::ModelShape shape = kiln::jit::read_model_config(llama4);
  CHECK(shape.ops.at(Op::swiglu) == std::vector<std::int64_t>{8192, 16384});
  CHECK(shape.ops.at(Op::rms_norm) == std::vector<std::int64_t>{5120, 128});
  nlohmann::json without = llama4;
  without["use_qk_norm"] = false;
  without.erase("intermediate_size_mlp");
  const kiln::jit::ModelShape plain = kiln::jit::read_model_config(without);
  CHECK(plain.ops.at(Op::swiglu) == std::vector<std::int64_t>{8192});
  CHECK(plain.ops.at(Op::rms_norm) == std::vector<std::int64_t>{5120});
  // Its RoPE: pairs by complex frequencies, an fp32 half table as kiln's patch hands it over.
  CHECK(shape.rope_tables ==
        std::vector<std::uint32_t>{kiln::kRopeInterleaved | kiln::kRopeHalfTable |
                                   kiln::kRopeTableF32});
}

TEST_CASE("models that hand RoPE another table or a slice prewarm the problems they call") {
  // GPT-OSS: a [.., D / 2] table, one angle a pair, of the model's dtype.
  const nlohmann::json gpt_oss = {{"model_type", "gpt_oss"},   {"hidden_size", 2880},
                                  {"intermediate_size", 2880}, {"num_attention_heads", 64},
                                  {"num_key_value_heads", 8},  {"head_dim", 64}};
  const kiln::jit::ModelShape oss = kiln::jit::read_model_config(gpt_oss);
  CHECK(oss.rope_tables == std::vector<std::uint32_t>{kiln::kRopeHalfTable});
  CHECK(oss.rotary_dim == 0);
  // Its experts gate with kiln's clamped_swiglu, and it has no other MLP.
  CHECK_FALSE(oss.ops.contains(Op::swiglu));
  CHECK(oss.ops.at(Op::clamped_swiglu) == std::vector<std::int64_t>{2880});
  CHECK(oss.ops.at(Op::fused_add_rms_norm) == std::vector<std::int64_t>{2880});
  // GLM-4: interleaved pairs over the first half of each head, half the table's columns read.
  const nlohmann::json glm4 = {{"model_type", "glm4"},        {"hidden_size", 4096},
                               {"intermediate_size", 13696},  {"num_attention_heads", 32},
                               {"num_key_value_heads", 2},    {"head_dim", 128},
                               {"partial_rotary_factor", 0.5}};
  const kiln::jit::ModelShape glm = kiln::jit::read_model_config(glm4);
  CHECK(glm.rope_tables ==
        std::vector<std::uint32_t>{kiln::kRopeInterleaved | kiln::kRopeHalfTable});
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

TEST_CASE("latent attention's RoPE is prewarmed at its rotated width, one k head, its form") {
  // DeepSeek-V3's config.json: no head_dim, no rope_interleave (its code then decides, and
  // transformers' default de-interleaves): 64 rotated columns, 128 q heads and one k head,
  // de-interleaved from the first half of the model's table, or not.
  nlohmann::json deepseek = {
      {"model_type", "deepseek_v3"}, {"hidden_size", 7168},        {"intermediate_size", 18432},
      {"num_attention_heads", 128},  {"num_key_value_heads", 128}, {"qk_rope_head_dim", 64},
      {"qk_nope_head_dim", 128},     {"kv_lora_rank", 512},        {"rope_theta", 10000}};
  constexpr std::uint32_t kPairs = kiln::kRopeDeinterleave | kiln::kRopeHalfTable;
  kiln::jit::ModelShape model = kiln::jit::read_model_config(deepseek);
  CHECK(model.ops.at(Op::rope) == std::vector<std::int64_t>{64});
  CHECK(model.heads_q == 128);
  CHECK(model.heads_k == 1);
  CHECK(model.rope_tables == std::vector<std::uint32_t>{kPairs, 0u});
  CHECK(model.rope.find("64 rotated columns (one k head)") != std::string::npos);
  const auto problems = kiln::family(Op::rope).common_problems(
      kiln::DType::bf16, 64, kiln::jit::prewarm_model(model, true));
  const auto has = [&](std::uint32_t flags) {
    return std::any_of(problems.begin(), problems.end(),
                       [&](const kiln::Problem& p) { return p.flags == flags && p.aux == 0; });
  };
  // Heads inner (q_rot is a view of [B, S, H, D] memory), no head-count flags (one k head),
  // and their backward.
  CHECK(has(kPairs));
  CHECK(has(kPairs | kiln::kRopeInverse));
  CHECK(has(0u));
  CHECK(has(kiln::kRopeInverse));
  // Said by the config: that form alone.
  deepseek["rope_interleave"] = false;
  CHECK(kiln::jit::read_model_config(deepseek).rope_tables == std::vector<std::uint32_t>{0u});
  deepseek["rope_interleave"] = true;
  CHECK(kiln::jit::read_model_config(deepseek).rope_tables == std::vector<std::uint32_t>{kPairs});
  // DeepSeek-V2: the same latent attention, its pairs turned by complex frequencies (kiln's
  // patch hands over their real and imaginary parts as an fp32 half table), whatever
  // rope_interleave says.
  deepseek["model_type"] = "deepseek_v2";
  const kiln::jit::ModelShape v2 = kiln::jit::read_model_config(deepseek);
  constexpr std::uint32_t kComplex =
      kiln::kRopeInterleaved | kiln::kRopeHalfTable | kiln::kRopeTableF32;
  CHECK(v2.rope_tables == std::vector<std::uint32_t>{kComplex});
  CHECK(v2.heads_k == 1);
  CHECK(v2.ops.at(Op::rope) == std::vector<std::int64_t>{64});
}

TEST_CASE("routed experts of their own width are one more SwiGLU") {
  // Qwen3-30B-A3B: a dense width it does not use but in mlp_only_layers, experts of 768.
  nlohmann::json qwen3_moe = {{"model_type", "qwen3_moe"}, {"hidden_size", 2048},
                              {"intermediate_size", 6144}, {"moe_intermediate_size", 768},
                              {"num_attention_heads", 32}, {"num_key_value_heads", 4},
                              {"head_dim", 128},           {"num_experts", 128}};
  CHECK(kiln::jit::read_model_config(qwen3_moe).ops.at(Op::swiglu) ==
        std::vector<std::int64_t>{6144, 768});
  // Without a count of routed experts the width is not one (a config's leftover key).
  qwen3_moe.erase("num_experts");
  CHECK(kiln::jit::read_model_config(qwen3_moe).ops.at(Op::swiglu) ==
        std::vector<std::int64_t>{6144});
  // DeepSeek-V3: a shared expert and 256 routed ones of 2048; Mixtral's experts are its
  // intermediate_size.
  nlohmann::json deepseek = {{"model_type", "deepseek_v3"}, {"hidden_size", 7168},
                             {"intermediate_size", 18432},  {"moe_intermediate_size", 2048},
                             {"n_shared_experts", 1},       {"n_routed_experts", 256},
                             {"num_attention_heads", 128}};
  CHECK(kiln::jit::read_model_config(deepseek).ops.at(Op::swiglu) ==
        std::vector<std::int64_t>{18432, 2048});
  nlohmann::json mixtral = {{"model_type", "mixtral"},    {"hidden_size", 4096},
                            {"intermediate_size", 14336}, {"num_attention_heads", 32},
                            {"num_key_value_heads", 8},   {"num_local_experts", 8}};
  CHECK(kiln::jit::read_model_config(mixtral).ops.at(Op::swiglu) ==
        std::vector<std::int64_t>{14336});
}

TEST_CASE("a multimodal config's language model is read from its text_config") {
  const nlohmann::json qwen3_5 = {
      {"model_type", "qwen3_5"},
      {"vision_config",
       {{"hidden_size", 1152},
        {"depth", 27},
        {"intermediate_size", 4304},
        {"num_heads", 16},
        {"hidden_act", "gelu_pytorch_tanh"}}},
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

  // Falcon-H1: a gated norm only with mamba_rms_norm, over mamba_d_ssm channels, the gate after
  // the norm unless mamba_norm_before_gate is false; one group (kiln's patch takes no other).
  nlohmann::json falcon = {{"model_type", "falcon_h1"},  {"hidden_size", 3072},
                           {"intermediate_size", 12288}, {"num_attention_heads", 12},
                           {"num_key_value_heads", 2},   {"mamba_expand", 2},
                           {"mamba_d_ssm", 3072},        {"mamba_n_groups", 1},
                           {"mamba_rms_norm", false},    {"mamba_norm_before_gate", true}};
  CHECK(kiln::jit::read_model_config(falcon).ops.count(Op::rms_norm_gated) == 0);
  falcon["mamba_rms_norm"] = true;
  model = kiln::jit::read_model_config(falcon);
  CHECK(model.ops.at(Op::rms_norm_gated) == std::vector<std::int64_t>{3072});
  CHECK(model.gated_norm_flags == kiln::kNormWeight);
  falcon["mamba_norm_before_gate"] = false;
  falcon["mamba_d_ssm"] = nullptr;  // mamba_expand x hidden
  model = kiln::jit::read_model_config(falcon);
  CHECK(model.ops.at(Op::rms_norm_gated) == std::vector<std::int64_t>{6144});
  CHECK(model.gated_norm_flags == (kiln::kNormGateFirst | kiln::kNormWeight));
  falcon["mamba_n_groups"] = 2;
  CHECK(kiln::jit::read_model_config(falcon).ops.count(Op::rms_norm_gated) == 0);

  // Kimi Linear: each delta-attention head closed by a sigmoid-gated norm; its MLA's compressed kv
  // normalised; its shared expert a SwiGLU of moe_intermediate_size x num_shared_experts.
  nlohmann::json kimi = {
      {"model_type", "kimi_linear"},   {"hidden_size", 2304},     {"intermediate_size", 9216},
      {"moe_intermediate_size", 1024}, {"num_shared_experts", 1}, {"num_attention_heads", 32},
      {"num_key_value_heads", 32},     {"head_dim", 64},          {"kv_lora_rank", 512},
      {"q_lora_rank", nullptr},        {"linear_head_dim", 128}};
  model = kiln::jit::read_model_config(kimi);
  CHECK(model.ops.at(Op::rms_norm_gated) == std::vector<std::int64_t>{128});
  CHECK(model.gated_norm_flags == (kiln::kNormWeight | kiln::kNormGateSigmoid));
  CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{2304, 512});
  CHECK(model.ops.at(Op::swiglu) == std::vector<std::int64_t>{9216, 1024});
  // GLM-5 Next's language model (its config's text_config): the same gated norm, a head_dim of
  // 0 read as absent, its hyper-connections' norm of 4 streams, its indexer's key LayerNorm.
  nlohmann::json glm = {{"text_config",
                         {{"model_type", "glm5_next_text"},
                          {"hidden_size", 4096},
                          {"intermediate_size", 12288},
                          {"moe_intermediate_size", 2048},
                          {"n_shared_experts", 1},
                          {"num_attention_heads", 64},
                          {"head_dim", 0},
                          {"kv_lora_rank", 512},
                          {"q_lora_rank", 1536},
                          {"linear_head_dim", 128},
                          {"hc_mult", 4},
                          {"index_head_dim", 128}}}};
  model = kiln::jit::read_model_config(glm);
  CHECK(model.head_dim == 64);
  CHECK(model.ops.at(Op::rms_norm_gated) == std::vector<std::int64_t>{128});
  CHECK(model.gated_norm_flags == (kiln::kNormWeight | kiln::kNormGateSigmoid));
  CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{4096, 512, 1536, 16384});
  CHECK(model.ops.at(Op::layer_norm) == std::vector<std::int64_t>{128});
  // DeepSeek-V3: both compressions normalised, two shared experts summed.
  nlohmann::json deepseek = {{"model_type", "deepseek_v3"}, {"hidden_size", 7168},
                             {"intermediate_size", 18432},  {"moe_intermediate_size", 2048},
                             {"n_shared_experts", 1},       {"num_attention_heads", 128},
                             {"kv_lora_rank", 512},         {"q_lora_rank", 1536}};
  model = kiln::jit::read_model_config(deepseek);
  CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{7168, 512, 1536});
  CHECK(model.ops.at(Op::swiglu) == std::vector<std::int64_t>{18432, 2048});
  CHECK(model.ops.count(Op::rms_norm_gated) == 0);

  // A model with neither a linear attention nor a Mamba mixer has no gated norm; Qwen3-Next's is
  // the linear attention's form (the default flags).
  nlohmann::json llama = {{"model_type", "llama"},
                          {"hidden_size", 4096},
                          {"intermediate_size", 14336},
                          {"num_attention_heads", 32}};
  CHECK(kiln::jit::read_model_config(llama).ops.count(Op::rms_norm_gated) == 0);
  CHECK(!kiln::jit::read_model_config(qwen3_next()).gated_norm_flags.has_value());
}

namespace {

// The keys kiln reads of diffusers' config.json for LTX-Video 0.9 and Wan 2.1 14B.
nlohmann::json ltx_video() {
  return {{"_class_name", "LTXVideoTransformer3DModel"},
          {"attention_head_dim", 64},
          {"num_attention_heads", 32},
          {"cross_attention_dim", 2048}};
}

nlohmann::json wan() {
  return {{"_class_name", "WanTransformer3DModel"},
          {"attention_head_dim", 128},
          {"num_attention_heads", 40},
          {"ffn_dim", 13824},
          {"qk_norm", "rms_norm_across_heads"},
          {"cross_attn_norm", true}};
}

// The flags of the problems prewarm compiles for `op` at `hidden` in `dtype`.
std::vector<std::uint32_t> prewarmed_flags(const std::vector<kiln::jit::PrewarmTarget>& targets,
                                           Op op, std::int64_t hidden, kiln::DType dtype) {
  std::vector<std::uint32_t> flags;
  for (const auto& target : targets) {
    if (target.problem.op == op && target.problem.hidden == hidden &&
        target.problem.dtype == dtype) {
      flags.push_back(target.problem.flags);
    }
  }
  std::sort(flags.begin(), flags.end());
  return flags;
}

std::vector<kiln::jit::PrewarmTarget> targets_of(const kiln::jit::ModelShape& model,
                                                 bool training = false) {
  std::vector<std::string> notes;
  return kiln::jit::model_targets(model, {}, {kiln::DType::bf16}, {90}, training, notes);
}

}  // namespace

TEST_CASE("LTX-Video's patched blocks and attentions are prewarmed as they call kiln") {
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(ltx_video());
  CHECK(model.kind == "ltx-video");
  CHECK(model.hidden == 2048);
  const auto targets = targets_of(model);
  using kiln::kNormPerToken, kiln::kNormTable;
  // The AdaLN seams: an RMSNorm, the table rows beside temb, per sample (text to video) and
  // per token (conditioned frames); no LayerNorm form, which only FLUX and Wan call.
  for (Op op : {Op::adaln, Op::gated_adaln}) {
    CHECK(prewarmed_flags(targets, op, 2048, kiln::DType::bf16) ==
          std::vector<std::uint32_t>{kNormTable, kNormTable | kNormPerToken});
  }
  // q/k norms across heads and the rotation, angles from the video grid or from a table.
  CHECK(prewarmed_flags(targets, Op::rms_norm_rope, 2048, kiln::DType::bf16) ==
        std::vector<std::uint32_t>{kiln::kRmsNormRopeVideo, kiln::kRmsNormRopeTableF32});
  // The output norm: a LayerNorm with no affine parameters.
  const auto layer = prewarmed_flags(targets, Op::layer_norm, 2048, kiln::DType::bf16);
  CHECK(std::count(layer.begin(), layer.end(), 0u) == 1);
  CHECK(prewarmed_flags(targets, Op::layer_norm, 2048, kiln::DType::f32).empty());
}

TEST_CASE("Wan's patched blocks and attentions are prewarmed as they call kiln") {
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(wan());
  CHECK(model.kind == "wan");
  CHECK(model.hidden == 5120);
  CHECK(model.ops.at(Op::gelu) == std::vector<std::int64_t>{13824});
  const auto targets = targets_of(model);
  // The seams over a LayerNorm, read from diffusers' fp32 tables; Wan 2.2's TI2V per token.
  constexpr std::uint32_t kSeam = kiln::kNormLayer | kiln::kNormTable | kiln::kNormTableF32;
  for (Op op : {Op::adaln, Op::gated_adaln}) {
    CHECK(prewarmed_flags(targets, op, 5120, kiln::DType::bf16) ==
          std::vector<std::uint32_t>{kSeam, kSeam | kiln::kNormPerToken});
  }
  // rms_norm_rope from diffusers' fp32 tables, read as half tables of the head dim (aux).
  int fused = 0;
  for (const auto& target : targets) {
    if (target.problem.op == Op::rms_norm_rope) {
      CHECK(target.problem.flags == kiln::kRmsNormRopeTableF32);
      CHECK(target.problem.aux == 128);
      CHECK_NOTHROW(kiln::family(Op::rms_norm_rope).check(target.problem));
      ++fused;
    }
  }
  CHECK(fused == 1);
  // The output norm runs in fp32 whatever the model's dtype; nothing else does.
  CHECK(prewarmed_flags(targets, Op::layer_norm, 5120, kiln::DType::f32) ==
        std::vector<std::uint32_t>{0u, kiln::kNormWeight | kiln::kNormBias});
  CHECK(prewarmed_flags(targets, Op::adaln, 5120, kiln::DType::f32).empty());
  // Training: kiln.rope over diffusers' half tables as the attention hands q and k over, its
  // inverse, and the fp32 output norm's backward in fp32.
  const auto training = targets_of(model, true);
  constexpr std::uint32_t kWanRope =
      kiln::kRopeInterleaved | kiln::kRopeTableF32 | kiln::kRopeHalfTable;
  const auto rope = prewarmed_flags(training, Op::rope, 128, kiln::DType::bf16);
  const std::uint32_t heads = kiln::rope_head_flags(40, 40);
  CHECK(std::count(rope.begin(), rope.end(), kWanRope | heads) == 1);
  CHECK(std::count(rope.begin(), rope.end(), kWanRope | heads | kiln::kRopeInverse) == 1);
  CHECK(!prewarmed_flags(training, Op::layer_norm_backward, 5120, kiln::DType::f32).empty());

  // Wan's image to video: the image embedder's fp32 LayerNorms at the image width and its GELU.
  nlohmann::json i2v = wan();
  i2v["image_dim"] = 1280;
  i2v["added_kv_proj_dim"] = 5120;
  const auto image = targets_of(kiln::jit::read_model_config(i2v));
  CHECK(prewarmed_flags(image, Op::layer_norm, 1280, kiln::DType::f32) ==
        std::vector<std::uint32_t>{0u, kiln::kNormWeight | kiln::kNormBias});
  CHECK(!prewarmed_flags(image, Op::gelu, 1280, kiln::DType::bf16).empty());
  CHECK(prewarmed_flags(targets, Op::layer_norm, 1280, kiln::DType::f32).empty());
}

TEST_CASE("an adaln prewarmed from an op list covers FLUX's, LTX-Video's and Wan's seams") {
  const auto problems =
      kiln::family(Op::gated_adaln).common_problems(kiln::DType::bf16, 3072, kiln::PrewarmModel{});
  std::vector<std::uint32_t> flags;
  for (const auto& p : problems) flags.push_back(p.flags);
  CHECK(flags == std::vector<std::uint32_t>{kiln::kNormLayer, kiln::kNormTable,
                                            kiln::kNormTable | kiln::kNormPerToken});
  // FLUX's config: its LayerNorm seams alone.
  const kiln::jit::ModelShape flux =
      kiln::jit::read_model_config({{"_class_name", "FluxTransformer2DModel"},
                                    {"attention_head_dim", 128},
                                    {"num_attention_heads", 24}});
  const auto flux_problems = kiln::family(Op::adaln).common_problems(
      kiln::DType::bf16, 3072, kiln::jit::prewarm_model(flux, false));
  REQUIRE(flux_problems.size() == 1);
  CHECK(flux_problems[0].flags == kiln::kNormLayer);
}

TEST_CASE("a multimodal config's vision tower is prewarmed as kiln's patch runs it") {
  // Qwen2.5-VL (an older config: the language model at the top level): RMSNorms, SwiGLU MLPs,
  // RoPE over 16 heads of 80 from an fp32 table.
  const nlohmann::json qwen2_5_vl = {{"model_type", "qwen2_5_vl"},
                                     {"hidden_size", 3584},
                                     {"intermediate_size", 18944},
                                     {"num_attention_heads", 28},
                                     {"num_key_value_heads", 4},
                                     {"vision_config",
                                      {{"model_type", "qwen2_5_vl"},
                                       {"hidden_size", 1280},
                                       {"intermediate_size", 3420},
                                       {"num_heads", 16},
                                       {"out_hidden_size", 3584},
                                       {"hidden_act", "silu"}}}};
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(qwen2_5_vl);
  CHECK(model.hidden == 3584);
  REQUIRE(model.towers.size() == 1);
  const kiln::jit::ModelShape& tower = model.towers[0];
  CHECK(tower.kind == "qwen2_5_vl vision tower");
  CHECK(tower.ops.at(Op::rms_norm) == std::vector<std::int64_t>{1280});
  CHECK(tower.ops.at(Op::swiglu) == std::vector<std::int64_t>{3420});
  CHECK(tower.ops.at(Op::rope) == std::vector<std::int64_t>{80});
  CHECK(tower.rope_tables == std::vector<std::uint32_t>{kiln::kRopeTableF32});
  CHECK(tower.heads_q == 16);
  // Its targets join the language model's: the tower's RoPE at 80 with an fp32 table, its norm
  // at 1280; the language model's RoPE at 128.
  const auto targets = targets_of(model);
  const auto has = [&](Op op, std::int64_t hidden, std::uint32_t flags) {
    return std::any_of(targets.begin(), targets.end(), [&](const kiln::jit::PrewarmTarget& t) {
      return t.problem.op == op && t.problem.hidden == hidden && (t.problem.flags & flags) == flags;
    });
  };
  CHECK(has(Op::rope, 80, kiln::kRopeTableF32));
  CHECK(has(Op::rope, 128, 0));
  CHECK(has(Op::rms_norm, 1280, 0));
  CHECK(has(Op::swiglu, 3420, 0));
  CHECK_FALSE(has(Op::fused_add_rms_norm, 1280, 0));  // the tower has no residual norm
  CHECK(std::all_of(targets.begin(), targets.end(), [&](const kiln::jit::PrewarmTarget& t) {
    return std::count(targets.begin(), targets.end(), t) == 1;
  }));
  // An --op list prewarms the tower's ops among those only, at the tower's sizes.
  std::vector<std::string> notes;
  const auto ropes =
      kiln::jit::model_targets(model, {Op::rope}, {kiln::DType::bf16}, {90}, false, notes);
  CHECK(std::all_of(ropes.begin(), ropes.end(),
                    [](const kiln::jit::PrewarmTarget& t) { return t.problem.op == Op::rope; }));
  CHECK(std::any_of(ropes.begin(), ropes.end(),
                    [](const kiln::jit::PrewarmTarget& t) { return t.problem.hidden == 80; }));

  // Qwen3-VL (transformers 5's layout): LayerNorms, tanh-GELU MLPs, 16 heads of 72.
  const nlohmann::json qwen3_vl = {{"model_type", "qwen3_vl"},
                                   {"text_config",
                                    {{"model_type", "qwen3_vl_text"},
                                     {"hidden_size", 4096},
                                     {"intermediate_size", 12288},
                                     {"num_attention_heads", 32},
                                     {"num_key_value_heads", 8},
                                     {"head_dim", 128}}},
                                   {"vision_config",
                                    {{"model_type", "qwen3_vl_vision"},
                                     {"hidden_size", 1152},
                                     {"intermediate_size", 4304},
                                     {"num_heads", 16},
                                     {"deepstack_visual_indexes", {8, 16, 24}},
                                     {"hidden_act", "gelu_pytorch_tanh"}}}};
  const kiln::jit::ModelShape vl3 = kiln::jit::read_model_config(qwen3_vl);
  REQUIRE(vl3.towers.size() == 1);
  // Its blocks' and final merger's norms at 1152, the deepstack mergers' at 4 x 1152.
  CHECK(vl3.towers[0].ops.at(Op::layer_norm) == std::vector<std::int64_t>{1152, 4608});
  CHECK(vl3.towers[0].ops.at(Op::gelu) == std::vector<std::int64_t>{4304});
  CHECK(vl3.towers[0].ops.at(Op::rope) == std::vector<std::int64_t>{72});

  // Qwen2-VL's tower is embed_dim wide (hidden_size is its merger's output), its MLP QuickGELU,
  // which the patch leaves.
  nlohmann::json qwen2_vl = qwen2_5_vl;
  qwen2_vl["model_type"] = "qwen2_vl";
  qwen2_vl["vision_config"] = {{"embed_dim", 1280},
                               {"hidden_size", 3584},
                               {"mlp_ratio", 4},
                               {"num_heads", 16},
                               {"hidden_act", "quick_gelu"}};
  const kiln::jit::ModelShape vl2 = kiln::jit::read_model_config(qwen2_vl);
  REQUIRE(vl2.towers.size() == 1);
  CHECK(vl2.towers[0].intermediate == 5120);
  CHECK(vl2.towers[0].ops.at(Op::layer_norm) == std::vector<std::int64_t>{1280});
  CHECK_FALSE(vl2.towers[0].ops.contains(Op::gelu));
  CHECK(vl2.towers[0].ops.at(Op::rope) == std::vector<std::int64_t>{80});

  // Gemma 3's SigLIP: LayerNorms and GELU, no RoPE.
  const nlohmann::json gemma3 = {{"model_type", "gemma3"},
                                 {"text_config",
                                  {{"model_type", "gemma3_text"},
                                   {"hidden_size", 2560},
                                   {"intermediate_size", 10240},
                                   {"num_attention_heads", 8},
                                   {"num_key_value_heads", 4},
                                   {"head_dim", 256}}},
                                 {"vision_config",
                                  {{"model_type", "siglip_vision_model"},
                                   {"hidden_size", 1152},
                                   {"intermediate_size", 4304},
                                   {"num_attention_heads", 16},
                                   {"hidden_act", "gelu_pytorch_tanh"}}}};
  const kiln::jit::ModelShape siglip = kiln::jit::read_model_config(gemma3).towers.at(0);
  CHECK(siglip.ops.at(Op::layer_norm) == std::vector<std::int64_t>{1152});
  CHECK(siglip.ops.at(Op::gelu) == std::vector<std::int64_t>{4304});
  CHECK_FALSE(siglip.ops.contains(Op::rope));

  // GLM-4V: RMSNorms and SwiGLU MLPs of out_hidden_size in its blocks, its merger's LayerNorm
  // at out_hidden_size, 12 heads of 128.
  const nlohmann::json glm4v = {{"model_type", "glm4v"},
                                {"text_config",
                                 {{"model_type", "glm4v_text"},
                                  {"hidden_size", 4096},
                                  {"intermediate_size", 13696},
                                  {"num_attention_heads", 32},
                                  {"num_key_value_heads", 2}}},
                                {"vision_config",
                                 {{"model_type", "glm4v_vision"},
                                  {"hidden_size", 1536},
                                  {"intermediate_size", 13696},
                                  {"out_hidden_size", 4096},
                                  {"num_heads", 12},
                                  {"hidden_act", "silu"}}}};
  const kiln::jit::ModelShape glm = kiln::jit::read_model_config(glm4v).towers.at(0);
  CHECK(glm.ops.at(Op::rms_norm) == std::vector<std::int64_t>{1536});
  CHECK(glm.ops.at(Op::layer_norm) == std::vector<std::int64_t>{4096});
  CHECK(glm.ops.at(Op::swiglu) == std::vector<std::int64_t>{4096});
  CHECK(glm.ops.at(Op::rope) == std::vector<std::int64_t>{128});

  // MiniMax-M3-VL: LayerNorms and erf-GELU MLPs at 1280, its 3-D RoPE over the first 78 of each
  // of 16 heads' 80 columns (26 an axis) from a table of the tower's dtype.
  nlohmann::json minimax = gemma3;
  minimax["model_type"] = "minimax_m3_vl";
  minimax["vision_config"] = {{"model_type", "minimax_m3_vl_vision"},
                              {"hidden_size", 1280},
                              {"intermediate_size", 5120},
                              {"num_attention_heads", 16},
                              {"hidden_act", "gelu"}};
  const kiln::jit::ModelShape m3 = kiln::jit::read_model_config(minimax).towers.at(0);
  CHECK(m3.ops.at(Op::layer_norm) == std::vector<std::int64_t>{1280});
  CHECK(m3.ops.at(Op::gelu) == std::vector<std::int64_t>{5120});
  CHECK(m3.ops.at(Op::rope) == std::vector<std::int64_t>{80});
  CHECK(m3.rotary_dim == 78);
  CHECK(m3.rope_tables == std::vector<std::uint32_t>{0u});
  CHECK(m3.rope.find("the first 78 of 80 columns") != std::string::npos);
  const auto m3_targets = targets_of(kiln::jit::read_model_config(minimax));
  CHECK(std::any_of(m3_targets.begin(), m3_targets.end(), [](const kiln::jit::PrewarmTarget& t) {
    return t.problem.op == Op::rope && t.problem.hidden == 80 && t.problem.aux == 78 &&
           (t.problem.flags & kiln::kRopeTableF32) == 0 && t.problem.align == 4;
  }));
  // Its table's 156-byte rows make every call 4-byte aligned, as the host computes it: no
  // MiniMax-M3-VL RoPE problem is prewarmed at 16 bytes.
  CHECK_FALSE(
      std::any_of(m3_targets.begin(), m3_targets.end(), [](const kiln::jit::PrewarmTarget& t) {
        return t.problem.op == Op::rope && t.problem.aux == 78 && t.problem.align == 16;
      }));
  // Earlier transformers (5.17) rotate each whole head by a 2-D RoPE from the same config: that
  // form too, RoPE alone.
  const auto m3_towers = kiln::jit::read_model_config(minimax).towers;
  REQUIRE(m3_towers.size() == 2);
  CHECK(m3_towers[1].ops.size() == 1);
  CHECK(m3_towers[1].rotary_dim == 0);
  CHECK(std::any_of(m3_targets.begin(), m3_targets.end(), [](const kiln::jit::PrewarmTarget& t) {
    return t.problem.op == Op::rope && t.problem.hidden == 80 && t.problem.aux == 0 &&
           (t.problem.flags & kiln::kRopeTableF32) == 0 && t.problem.align == 16;
  }));

  // A tower kiln's patch does not know is not prewarmed; a known one missing a size names it.
  nlohmann::json other = gemma3;
  other["vision_config"]["model_type"] = "clip_vision_model";
  CHECK(kiln::jit::read_model_config(other).towers.empty());
  nlohmann::json missing = qwen3_vl;
  missing["vision_config"].erase("num_heads");
  CHECK_THROWS_WITH_AS(kiln::jit::read_model_config(missing),
                       "kiln prewarm: config.json: vision_config: \"num_attention_heads\": "
                       "expected a positive integer, but it is missing",
                       kiln::Error);
}

TEST_CASE("Inkling 2 is prewarmed as its patched language model and tower call kiln") {
  // Its config.json's keys kiln reads: a language model whose every MLP is its routed experts
  // (no intermediate_size), value heads of 128 in both attentions, a tower of 16 heads of 64.
  const nlohmann::json inkling2 = {{"model_type", "inkling2"},
                                   {"text_config",
                                    {{"model_type", "inkling2_text"},
                                     {"hidden_size", 4608},
                                     {"moe_intermediate_size", 2304},
                                     {"n_routed_experts", 384},
                                     {"num_attention_heads", 48},
                                     {"num_key_value_heads", 8},
                                     {"head_dim", 128},
                                     {"swa_head_dim", 128}}},
                                   {"vision_config",
                                    {{"model_type", "inkling2_vision"},
                                     {"hidden_size", 1024},
                                     {"intermediate_size", 4096},
                                     {"num_attention_heads", 16},
                                     {"hidden_act", "gelu"}}}};
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(inkling2);
  CHECK(model.intermediate == 2304);
  // Norms alone: no RoPE, no residual-add norm, and the experts' softcapped gate is left.
  CHECK(model.ops.size() == 1);
  CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{4608, 128});
  const auto targets = targets_of(model);
  // The decoder layers' norms take fp32 rows with their weight, the block residuals' and value
  // heads' fp32 rows without; the embedding's norm the model's dtype.
  CHECK(prewarmed_flags(targets, Op::rms_norm, 4608, kiln::DType::f32) ==
        std::vector<std::uint32_t>{0u, kiln::kNormWeight});
  CHECK(prewarmed_flags(targets, Op::rms_norm, 128, kiln::DType::f32).size() == 2);
  CHECK(!prewarmed_flags(targets, Op::rms_norm, 4608, kiln::DType::bf16).empty());
  REQUIRE(model.towers.size() == 1);
  const kiln::jit::ModelShape& tower = model.towers[0];
  CHECK(tower.ops.at(Op::layer_norm) == std::vector<std::int64_t>{1024});
  CHECK(tower.ops.at(Op::gelu) == std::vector<std::int64_t>{4096});
  CHECK(tower.ops.at(Op::rope) == std::vector<std::int64_t>{64});
  CHECK(tower.rope_tables ==
        std::vector<std::uint32_t>{kiln::kRopeInterleaved | kiln::kRopeTableF32});
  CHECK(tower.rope.starts_with("interleaved pairs"));
  const std::uint32_t heads = kiln::rope_head_flags(16, 16);
  const auto rope = prewarmed_flags(targets, Op::rope, 64, kiln::DType::bf16);
  CHECK(std::count(rope.begin(), rope.end(),
                   kiln::kRopeInterleaved | kiln::kRopeTableF32 | heads) == 1);

  // Another MoE with no dense width: its experts' SwiGLU is its only MLP's.
  const nlohmann::json experts_only = {{"model_type", "moe"},
                                       {"hidden_size", 2048},
                                       {"moe_intermediate_size", 768},
                                       {"num_experts", 64},
                                       {"num_attention_heads", 16}};
  CHECK(kiln::jit::read_model_config(experts_only).ops.at(Op::swiglu) ==
        std::vector<std::int64_t>{768});
  // Without routed experts, a missing intermediate_size is still named.
  nlohmann::json dense = experts_only;
  dense.erase("num_experts");
  CHECK_THROWS_WITH_AS(kiln::jit::read_model_config(dense),
                       "kiln prewarm: config.json: \"intermediate_size\": expected a positive "
                       "integer, but it is missing",
                       kiln::Error);
}

TEST_CASE("CogVideoX's patched blocks are prewarmed as they call kiln") {
  // CogVideoX-2b's config.json, the keys kiln reads.
  const nlohmann::json cogvideox = {{"_class_name", "CogVideoXTransformer3DModel"},
                                    {"attention_head_dim", 64},
                                    {"num_attention_heads", 30},
                                    {"num_layers", 30},
                                    {"use_rotary_positional_embeddings", false}};
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(cogvideox);
  CHECK(model.kind == "cogvideox");
  CHECK(model.ops.at(Op::layer_norm) == std::vector<std::int64_t>{1920, 64});
  CHECK(model.ops.at(Op::gelu) == std::vector<std::int64_t>{7680});
  CHECK_FALSE(model.ops.contains(Op::rope));
  const auto targets = targets_of(model);
  // Each stream's AdaLN and block seam over an affine LayerNorm (its weight in the kernel),
  // per sample; the gated residual in place, per sample.
  for (Op op : {Op::adaln, Op::gated_adaln}) {
    CHECK(prewarmed_flags(targets, op, 1920, kiln::DType::bf16) ==
          std::vector<std::uint32_t>{kiln::kNormWeight | kiln::kNormLayer});
  }
  const auto residual = prewarmed_flags(targets, Op::gated_residual, 1920, kiln::DType::bf16);
  CHECK(std::count(residual.begin(), residual.end(),
                   kiln::kGatePerSample | kiln::kGatedResidualInPlace) == 1);
  CHECK(prewarmed_flags(targets, Op::layer_norm, 64, kiln::DType::bf16) ==
        std::vector<std::uint32_t>{0u, kiln::kNormWeight | kiln::kNormBias});
  // Training: the AdaLN's backward with the norm's weight (its gradient too).
  const auto backward =
      prewarmed_flags(targets_of(model, true), Op::adaln_backward, 1920, kiln::DType::bf16);
  CHECK(std::count(backward.begin(), backward.end(), kiln::kNormWeight | kiln::kNormLayer) == 1);

  // CogVideoX-5b: 48 heads of 64, the video tokens' q and k rotated from fp32 tables
  // (interleaved pairs), [B, H, S, D] whichever memory order the norms leave.
  nlohmann::json five_b = cogvideox;
  five_b["num_attention_heads"] = 48;
  five_b["use_rotary_positional_embeddings"] = true;
  const kiln::jit::ModelShape rotating = kiln::jit::read_model_config(five_b);
  CHECK(rotating.ops.at(Op::rope) == std::vector<std::int64_t>{64});
  const auto rope = prewarmed_flags(targets_of(rotating), Op::rope, 64, kiln::DType::bf16);
  const std::uint32_t table =
      kiln::kRopeInterleaved | kiln::kRopeTableF32 | kiln::kRopeHeadsEven | kiln::kRopeHeadsBy4;
  CHECK(std::count(rope.begin(), rope.end(), table) == 1);
  CHECK(std::count(rope.begin(), rope.end(), table | kiln::kRopePositionsInner) == 1);
}

TEST_CASE("Qwen-Image's patched blocks and attention are prewarmed as they call kiln") {
  // Qwen-Image's config.json, the keys kiln reads; Qwen-Image-Edit-2511's adds zero_cond_t.
  nlohmann::json qwen_image = {{"_class_name", "QwenImageTransformer2DModel"},
                               {"attention_head_dim", 128},
                               {"num_attention_heads", 24},
                               {"joint_attention_dim", 3584},
                               {"num_layers", 60},
                               {"axes_dims_rope", {16, 56, 56}}};
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(qwen_image);
  CHECK(model.kind == "qwen-image");
  CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{128, 3584});
  CHECK(model.ops.at(Op::gelu) == std::vector<std::int64_t>{12288});
  const auto targets = targets_of(model);
  // Each stream's AdaLN and block seam over a LayerNorm with no affine, per sample.
  for (Op op : {Op::adaln, Op::gated_adaln}) {
    CHECK(prewarmed_flags(targets, op, 3072, kiln::DType::bf16) ==
          std::vector<std::uint32_t>{kiln::kNormLayer});
  }
  // The per-head q/k norms and the rotation from the complex frequencies' fp32 half tables,
  // interleaved pairs, q and k [B, S, H, D] with 24 heads each.
  const std::uint32_t table = kiln::kRopeInterleaved | kiln::kRopeTableF32 | kiln::kRopeHalfTable;
  const std::uint32_t heads = kiln::kRopeHeadsEven | kiln::kRopeHeadsBy4;
  const auto rope = prewarmed_flags(targets, Op::rope, 128, kiln::DType::bf16);
  CHECK(std::count(rope.begin(), rope.end(), table | heads | kiln::kRopeHeadNorm) == 1);
  CHECK(std::count(rope.begin(), rope.end(), table | heads) == 1);

  qwen_image["zero_cond_t"] = true;
  const auto edit = targets_of(kiln::jit::read_model_config(qwen_image));
  for (Op op : {Op::adaln, Op::gated_adaln}) {
    CHECK(prewarmed_flags(edit, op, 3072, kiln::DType::bf16) ==
          std::vector<std::uint32_t>{kiln::kNormLayer, kiln::kNormLayer | kiln::kNormPerToken});
  }
}

TEST_CASE("FLUX.2's patched blocks and attentions are prewarmed as they call kiln") {
  // FLUX.2-dev's config.json, the keys kiln reads.
  const nlohmann::json flux2 = {{"_class_name", "Flux2Transformer2DModel"},
                                {"attention_head_dim", 128},
                                {"num_attention_heads", 48},
                                {"mlp_ratio", 3.0},
                                {"axes_dims_rope", {32, 32, 32, 32}}};
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(flux2);
  CHECK(model.kind == "flux2");
  CHECK(model.ops.at(Op::swiglu) == std::vector<std::int64_t>{18432});
  CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{128});
  const auto targets = targets_of(model);
  for (Op op : {Op::adaln, Op::gated_adaln}) {
    CHECK(prewarmed_flags(targets, op, 6144, kiln::DType::bf16) ==
          std::vector<std::uint32_t>{kiln::kNormLayer});
  }
  // The per-head q/k norms and rotation from diffusers' fp32 table, interleaved, 48 + 48 heads.
  const std::uint32_t fused = kiln::kRopeInterleaved | kiln::kRopeTableF32 | kiln::kRopeHeadsEven |
                              kiln::kRopeHeadsBy4 | kiln::kRopeHeadNorm;
  const auto rope = prewarmed_flags(targets, Op::rope, 128, kiln::DType::bf16);
  CHECK(std::count(rope.begin(), rope.end(), fused) == 1);
}

TEST_CASE(
    "FLUX.3's patched attentions and blocks are prewarmed as they call kiln, with and without "
    "autograd") {
  // FLUX.3's config.json, the keys kiln reads.
  const nlohmann::json flux3 = {{"_class_name", "Flux3Transformer2DModel"},
                                {"attention_head_dim", 128},
                                {"num_attention_heads", 24},
                                {"mlp_ratio", 3.0},
                                {"axes_dims_rope", {32, 32, 32, 32}}};
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(flux3);
  CHECK(model.kind == "flux3");
  CHECK(model.ops.at(Op::swiglu) == std::vector<std::int64_t>{9216});
  CHECK(model.ops.at(Op::layer_norm) == std::vector<std::int64_t>{3072});
  CHECK(model.ops.at(Op::adaln) == std::vector<std::int64_t>{3072});
  CHECK(model.ops.at(Op::gated_residual) == std::vector<std::int64_t>{3072});
  const auto targets = targets_of(model);
  // The blocks' and the output's AdaLN over a LayerNorm with no affine, per sample (text to
  // image) and per token (the joint blocks' image stream with a reference image).
  CHECK(prewarmed_flags(targets, Op::adaln, 3072, kiln::DType::bf16) ==
        std::vector<std::uint32_t>{kiln::kNormLayer, kiln::kNormLayer | kiln::kNormPerToken});
  // The per-head q/k norms and rotation from diffusers' fp32 table, interleaved, 24 + 24 heads.
  const std::uint32_t fused = kiln::kRopeInterleaved | kiln::kRopeTableF32 | kiln::kRopeHeadsEven |
                              kiln::kRopeHeadsBy4 | kiln::kRopeHeadNorm;
  const auto rope = prewarmed_flags(targets, Op::rope, 128, kiln::DType::bf16);
  CHECK(std::count(rope.begin(), rope.end(), fused) == 1);
  // With autograd: diffusers' fp32 norms and kiln.rope of the fp32 heads.
  CHECK_FALSE(prewarmed_flags(targets, Op::rms_norm, 128, kiln::DType::f32).empty());
  const auto fp32_rope = prewarmed_flags(targets, Op::rope, 128, kiln::DType::f32);
  CHECK(std::count(fp32_rope.begin(), fp32_rope.end(),
                   kiln::kRopeInterleaved | kiln::kRopeTableF32 | kiln::kRopeHeadsEven |
                       kiln::kRopeHeadsBy4) == 1);
}

TEST_CASE("LTX-2's two streams and audio-video attentions are prewarmed as they call kiln") {
  // LTX-2's config.json, the keys kiln reads (its checkpoints rotate each head's halves).
  nlohmann::json ltx2 = {{"_class_name", "LTX2VideoTransformer3DModel"},
                         {"attention_head_dim", 128},
                         {"num_attention_heads", 32},
                         {"audio_attention_head_dim", 64},
                         {"audio_num_attention_heads", 32},
                         {"rope_type", "split"}};
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(ltx2);
  CHECK(model.kind == "ltx2");
  REQUIRE(model.towers.size() == 2);
  CHECK(model.ops.at(Op::gelu) == std::vector<std::int64_t>{16384});
  CHECK(model.towers[0].ops.at(Op::gelu) == std::vector<std::int64_t>{8192});
  const auto targets = targets_of(model);
  // Each stream's AdaLN and seams over an RMSNorm, table rows beside temb, per sample or token.
  for (std::int64_t width : {4096, 2048}) {
    for (Op op : {Op::adaln, Op::gated_adaln}) {
      CHECK(prewarmed_flags(targets, op, width, kiln::DType::bf16) ==
            std::vector<std::uint32_t>{kiln::kNormTable, kiln::kNormTable | kiln::kNormPerToken});
    }
  }
  // Each token's heads as rows of one head, an fp32 half table: q and k together (one head
  // each) in the self-attentions, each alone (no partner's heads) in the audio-video ones.
  const std::uint32_t half = kiln::kRopeTableF32 | kiln::kRopeHalfTable;
  const auto video = prewarmed_flags(targets, Op::rope, 128, kiln::DType::bf16);
  CHECK(std::count(video.begin(), video.end(), half | kiln::kRopeOneHeadEach) == 1);
  const auto audio = prewarmed_flags(targets, Op::rope, 64, kiln::DType::bf16);
  CHECK(std::count(audio.begin(), audio.end(), half | kiln::kRopeOneHeadEach) == 1);
  CHECK(std::count(audio.begin(), audio.end(), half) == 1);
  CHECK(prewarmed_flags(targets, Op::rms_norm_rope, 4096, kiln::DType::bf16).empty());

  // diffusers' default rotation: interleaved pairs across the row, the self-attentions' norms
  // and rotation fused, the audio-video attentions' queries and keys rotated alone.
  ltx2.erase("rope_type");
  const auto interleaved = targets_of(kiln::jit::read_model_config(ltx2));
  for (std::int64_t width : {4096, 2048}) {
    const auto fused = prewarmed_flags(interleaved, Op::rms_norm_rope, width, kiln::DType::bf16);
    CHECK(std::count(fused.begin(), fused.end(), kiln::kRmsNormRopeTableF32) == 1);
  }
  const auto alone = prewarmed_flags(interleaved, Op::rope, 2048, kiln::DType::bf16);
  CHECK(std::count(alone.begin(), alone.end(), kiln::kRopeInterleaved | kiln::kRopeTableF32) == 1);
}

TEST_CASE(
    "Z-Image's patched blocks, attentions and feed-forwards are prewarmed as they call kiln") {
  // Z-Image's config.json, the keys kiln reads; Z-Image-Omni's adds siglip_feat_dim.
  nlohmann::json z_image = {{"_class_name", "ZImageTransformer2DModel"},
                            {"dim", 3840},
                            {"n_heads", 30},
                            {"cap_feat_dim", 2560},
                            {"axes_dims", {32, 48, 48}}};
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(z_image);
  CHECK(model.kind == "z-image");
  CHECK(model.ops.at(Op::swiglu) == std::vector<std::int64_t>{10240});
  CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{3840, 128, 2560});
  CHECK(model.rope.find("axes_dims [32,48,48]") != std::string::npos);
  const auto targets = targets_of(model);
  // The modulated norms with their weight, no shift or table, per sample or per token.
  for (Op op : {Op::adaln, Op::gated_adaln}) {
    CHECK(prewarmed_flags(targets, op, 3840, kiln::DType::bf16) ==
          std::vector<std::uint32_t>{kiln::kNormWeight, kiln::kNormWeight | kiln::kNormPerToken});
  }
  // The per-head q/k norms and rotation from fp32 half tables, 30 + 30 heads.
  const std::uint32_t table = kiln::kRopeInterleaved | kiln::kRopeTableF32 | kiln::kRopeHalfTable;
  const auto rope = prewarmed_flags(targets, Op::rope, 128, kiln::DType::bf16);
  CHECK(std::count(rope.begin(), rope.end(), table | kiln::kRopeHeadsEven | kiln::kRopeHeadNorm) ==
        1);

  z_image["siglip_feat_dim"] = 1152;
  CHECK(kiln::jit::read_model_config(z_image).ops.at(Op::rms_norm).back() == 1152);
  z_image["n_heads"] = 7;
  CHECK_THROWS_WITH_AS(kiln::jit::read_model_config(z_image),
                       doctest::Contains("dim divisible by n_heads"), kiln::Error);
}

TEST_CASE("HunyuanVideo's patched blocks and attentions are prewarmed as they call kiln") {
  // HunyuanVideo's config.json, the keys kiln reads; its FramePack variant's reads alike.
  nlohmann::json hunyuan = {{"_class_name", "HunyuanVideoTransformer3DModel"},
                            {"attention_head_dim", 128},
                            {"num_attention_heads", 24},
                            {"mlp_ratio", 4.0},
                            {"rope_axes_dim", {16, 56, 56}}};
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(hunyuan);
  CHECK(model.kind == "hunyuan-video");
  CHECK(model.ops.at(Op::gelu) == std::vector<std::int64_t>{12288});
  CHECK(model.ops.at(Op::layer_norm) == std::vector<std::int64_t>{3072});
  CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{128});
  CHECK(model.rope.find("rope_axes_dim [16,56,56]") != std::string::npos);
  const auto targets = targets_of(model);
  // The modulated LayerNorms with no affine, per sample.
  for (Op op : {Op::adaln, Op::gated_adaln}) {
    CHECK(prewarmed_flags(targets, op, 3072, kiln::DType::bf16) ==
          std::vector<std::uint32_t>{kiln::kNormLayer});
  }
  // The per-head q/k norms and the rotation from diffusers' fp32 table, 24 + 24 heads.
  const std::uint32_t fused = kiln::kRopeInterleaved | kiln::kRopeTableF32 | kiln::kRopeHeadsEven |
                              kiln::kRopeHeadsBy4 | kiln::kRopeHeadNorm;
  const auto rope = prewarmed_flags(targets, Op::rope, 128, kiln::DType::bf16);
  CHECK(std::count(rope.begin(), rope.end(), fused) == 1);

  hunyuan["_class_name"] = "HunyuanVideoFramepackTransformer3DModel";
  CHECK(kiln::jit::read_model_config(hunyuan).kind == "hunyuan-video");
  // HunyuanVideo 1.5: 16 heads, the LayerNorms of its ByT5 and image projections too.
  const kiln::jit::ModelShape v15 =
      kiln::jit::read_model_config({{"_class_name", "HunyuanVideo15Transformer3DModel"},
                                    {"attention_head_dim", 128},
                                    {"num_attention_heads", 16},
                                    {"text_embed_2_dim", 1472},
                                    {"image_embed_dim", 1152}});
  CHECK(v15.kind == "hunyuan-video-1.5");
  CHECK(v15.ops.at(Op::layer_norm) == std::vector<std::int64_t>{2048, 1472, 1152});
  CHECK(v15.ops.at(Op::gelu) == std::vector<std::int64_t>{8192});
  // HunyuanImage 2.1: 28 heads, 2-D positions, its ByT5 projection's LayerNorm where it has one.
  nlohmann::json image = {{"_class_name", "HunyuanImageTransformer2DModel"},
                          {"attention_head_dim", 128},
                          {"num_attention_heads", 28},
                          {"text_embed_2_dim", 1472},
                          {"rope_axes_dim", {64, 64}}};
  const kiln::jit::ModelShape hunyuan_image = kiln::jit::read_model_config(image);
  CHECK(hunyuan_image.kind == "hunyuan-image");
  CHECK(hunyuan_image.ops.at(Op::layer_norm) == std::vector<std::int64_t>{3584, 1472});
  CHECK(hunyuan_image.rope.starts_with("2-D (rope_axes_dim [64,64])"));
  image.erase("text_embed_2_dim");
  CHECK(kiln::jit::read_model_config(image).ops.at(Op::layer_norm) ==
        std::vector<std::int64_t>{3584});
}

TEST_CASE("Mochi's patched blocks and attentions are prewarmed as they call kiln") {
  // Mochi 1's config.json, the keys kiln reads.
  const kiln::jit::ModelShape model =
      kiln::jit::read_model_config({{"_class_name", "MochiTransformer3DModel"},
                                    {"attention_head_dim", 128},
                                    {"num_attention_heads", 24},
                                    {"pooled_projection_dim", 1536}});
  CHECK(model.kind == "mochi");
  // Each stream's feed-forward: (4 x width x 2) / 3.
  CHECK(model.ops.at(Op::swiglu) == std::vector<std::int64_t>{8192, 4096});
  CHECK(model.ops.at(Op::adaln) == std::vector<std::int64_t>{3072, 1536});
  CHECK(model.ops.at(Op::gated_adaln) == std::vector<std::int64_t>{3072, 1536});
  const auto targets = targets_of(model);
  // The plain modulated RMSNorm, the output AdaLN, the gated norms and seams (fp32 table rows).
  const std::vector<std::uint32_t> modulations = {0u, kiln::kNormLayer,
                                                  kiln::kNormTable | kiln::kNormTableF32};
  for (std::int64_t width : {3072, 1536}) {
    CHECK(prewarmed_flags(targets, Op::gated_adaln, width, kiln::DType::bf16) == modulations);
  }
  // Each token's heads rotate as one row of 3072 by an fp32 half table, one head of q and of k.
  const std::uint32_t row =
      kiln::kRopeInterleaved | kiln::kRopeTableF32 | kiln::kRopeHalfTable | kiln::kRopeOneHeadEach;
  const auto rope = prewarmed_flags(targets, Op::rope, 3072, kiln::DType::bf16);
  CHECK(std::count(rope.begin(), rope.end(), row) == 1);
  CHECK(prewarmed_flags(targets, Op::rope, 128, kiln::DType::bf16).empty());
  // The per-head q/k RMSNorms; training runs the blocks' RMSNorms (no weight) on fp32 inputs.
  CHECK(!prewarmed_flags(targets, Op::rms_norm, 128, kiln::DType::bf16).empty());
  CHECK(!prewarmed_flags(targets, Op::rms_norm, 3072, kiln::DType::f32).empty());
}

TEST_CASE("Stable Diffusion 3's patched blocks are prewarmed as they call kiln") {
  // SD3.5 Large's config.json, the keys kiln reads.
  nlohmann::json sd35 = {{"_class_name", "SD3Transformer2DModel"},
                         {"attention_head_dim", 64},
                         {"num_attention_heads", 38},
                         {"qk_norm", "rms_norm"}};
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(sd35);
  CHECK(model.kind == "sd3");
  CHECK(model.ops.at(Op::gelu) == std::vector<std::int64_t>{9728});
  CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{64});
  CHECK_FALSE(model.ops.contains(Op::rope));
  const auto targets = targets_of(model);
  for (Op op : {Op::adaln, Op::gated_adaln}) {
    CHECK(prewarmed_flags(targets, op, 2432, kiln::DType::bf16) ==
          std::vector<std::uint32_t>{kiln::kNormLayer});
  }
  // The gated residuals: in place (a stream's feed-forward) and not (SD3.5 Medium's second
  // attention), per sample.
  const auto residual = prewarmed_flags(targets, Op::gated_residual, 2432, kiln::DType::bf16);
  CHECK(std::count(residual.begin(), residual.end(),
                   kiln::kGatePerSample | kiln::kGatedResidualInPlace) == 1);
  CHECK(std::count(residual.begin(), residual.end(), kiln::kGatePerSample) == 1);
  // SD3 (no q/k norms).
  sd35.erase("qk_norm");
  CHECK_FALSE(kiln::jit::read_model_config(sd35).ops.contains(Op::rms_norm));
}

TEST_CASE("Chroma is prewarmed as FLUX, with its approximator's RMSNorms") {
  // Chroma1-HD's config.json, the keys kiln reads.
  nlohmann::json chroma = {{"_class_name", "ChromaTransformer2DModel"},
                           {"attention_head_dim", 128},
                           {"num_attention_heads", 24},
                           {"approximator_hidden_dim", 5120}};
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(chroma);
  CHECK(model.kind == "chroma");
  CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{128, 5120});
  CHECK(model.ops.at(Op::gelu) == std::vector<std::int64_t>{12288});
  CHECK(model.ops.at(Op::rope) == std::vector<std::int64_t>{128});
  const auto targets = targets_of(model);
  for (Op op : {Op::adaln, Op::gated_adaln}) {
    CHECK(prewarmed_flags(targets, op, 3072, kiln::DType::bf16) ==
          std::vector<std::uint32_t>{kiln::kNormLayer});
  }
  CHECK(!prewarmed_flags(targets, Op::rms_norm, 5120, kiln::DType::bf16).empty());
  chroma.erase("approximator_hidden_dim");
  CHECK_THROWS_WITH_AS(kiln::jit::read_model_config(chroma),
                       doctest::Contains("approximator_hidden_dim"), kiln::Error);
}

TEST_CASE("Qwen-Image 2.1 is prewarmed per token under causal_condition, per sample without") {
  // Qwen-Image 2.1's config.json, the keys kiln reads.
  nlohmann::json config = {{"_class_name", "QwenImage21Transformer2DModel"},
                           {"attention_head_dim", 128},
                           {"num_attention_heads", 32},
                           {"mlp_ratio", 3},
                           {"context_in_dim", 4096},
                           {"causal_condition", true}};
  kiln::jit::ModelShape model = kiln::jit::read_model_config(config);
  CHECK(model.kind == "qwen-image-2.1");
  CHECK(model.ops.at(Op::swiglu) == std::vector<std::int64_t>{12288});
  CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{128, 4096});
  CHECK(model.ops.at(Op::rope) == std::vector<std::int64_t>{128});
  auto targets = targets_of(model);
  for (Op op : {Op::adaln, Op::gated_adaln}) {
    CHECK(prewarmed_flags(targets, op, 4096, kiln::DType::bf16) ==
          std::vector<std::uint32_t>{kiln::kNormLayer | kiln::kNormPerToken});
  }
  config["causal_condition"] = false;
  targets = targets_of(kiln::jit::read_model_config(config));
  CHECK(prewarmed_flags(targets, Op::adaln, 4096, kiln::DType::bf16) ==
        std::vector<std::uint32_t>{kiln::kNormLayer});
  config.erase("context_in_dim");
  CHECK_THROWS_WITH_AS(kiln::jit::read_model_config(config), doctest::Contains("context_in_dim"),
                       kiln::Error);
}

TEST_CASE(
    "Stable Audio 3 is prewarmed at its width, its heads', its seams' and its feed-forward's") {
  // Stable Audio 3's config.json, the keys kiln reads; diffusers' defaults where absent.
  nlohmann::json config = {{"_class_name", "StableAudio3DiTModel"},
                           {"embed_dim", 1536},
                           {"num_heads", 24},
                           {"ff_mult", 4.0}};
  kiln::jit::ModelShape model = kiln::jit::read_model_config(config);
  CHECK(model.kind == "stable-audio-3");
  CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{1536, 64});
  CHECK(model.ops.at(Op::swiglu) == std::vector<std::int64_t>{6144});
  for (Op op : {Op::adaln, Op::gated_adaln, Op::gated_residual}) {
    CHECK(model.ops.at(op) == std::vector<std::int64_t>{1536});
  }
  CHECK(model.ops.size() == 5);
  for (Op op : {Op::adaln, Op::gated_adaln}) {
    CHECK(prewarmed_flags(targets_of(model), op, 1536, kiln::DType::bf16) ==
          std::vector<std::uint32_t>{kiln::kNormWeight});
  }
  config["ff_mult"] = 2.5;
  config["embed_dim"] = 1000;
  config["num_heads"] = 8;
  model = kiln::jit::read_model_config(config);
  CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{1000, 125});
  CHECK(model.ops.at(Op::swiglu) == std::vector<std::int64_t>{2500});
  model = kiln::jit::read_model_config({{"_class_name", "StableAudio3DiTModel"}});
  CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{1536, 64});
  config["num_heads"] = 7;
  CHECK_THROWS_WITH_AS(kiln::jit::read_model_config(config),
                       doctest::Contains("embed_dim divisible by num_heads"), kiln::Error);
}

TEST_CASE("FLUX's copies are prewarmed as FLUX; Ovis-Image with its SwiGLU MLPs") {
  // Their config.json files, the keys kiln reads (Bria 3.2, Bria FIBO, LongCat-Image,
  // Ovis-Image-7B).
  for (const char* copy :
       {"BriaTransformer2DModel", "BriaFiboTransformer2DModel", "LongCatImageTransformer2DModel"}) {
    const nlohmann::json config = {
        {"_class_name", copy}, {"attention_head_dim", 128}, {"num_attention_heads", 24}};
    const kiln::jit::ModelShape model = kiln::jit::read_model_config(config);
    CHECK(model.kind == "flux");
    CHECK(model.ops.at(Op::gelu) == std::vector<std::int64_t>{12288});
    CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{128});
  }
  nlohmann::json ovis = {{"_class_name", "OvisImageTransformer2DModel"},
                         {"attention_head_dim", 128},
                         {"num_attention_heads", 24},
                         {"joint_attention_dim", 2048}};
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(ovis);
  CHECK(model.kind == "ovis-image");
  CHECK_FALSE(model.ops.contains(Op::gelu));
  CHECK(model.ops.at(Op::swiglu) == std::vector<std::int64_t>{12288});
  CHECK(model.ops.at(Op::rms_norm) == std::vector<std::int64_t>{128, 2048});
  CHECK(model.ops.at(Op::rope) == std::vector<std::int64_t>{128});
  const auto targets = targets_of(model);
  for (Op op : {Op::adaln, Op::gated_adaln}) {
    CHECK(prewarmed_flags(targets, op, 3072, kiln::DType::bf16) ==
          std::vector<std::uint32_t>{kiln::kNormLayer});
  }
  ovis.erase("joint_attention_dim");
  CHECK_THROWS_WITH_AS(kiln::jit::read_model_config(ovis), doctest::Contains("joint_attention_dim"),
                       kiln::Error);
}

TEST_CASE("SkyReels-V2 and Wan VACE are prewarmed as Wan, per sample and per token") {
  // SkyReels-V2-DF-1.3B's config.json, the keys kiln reads.
  const nlohmann::json skyreels = {{"_class_name", "SkyReelsV2Transformer3DModel"},
                                   {"attention_head_dim", 128},
                                   {"num_attention_heads", 12},
                                   {"ffn_dim", 8960},
                                   {"num_frame_per_block", 1}};
  const kiln::jit::ModelShape model = kiln::jit::read_model_config(skyreels);
  CHECK(model.kind == "skyreels-v2");
  // Wan VACE: Wan's kernels, its control blocks' too.
  nlohmann::json vace = skyreels;
  vace["_class_name"] = "WanVACETransformer3DModel";
  CHECK(kiln::jit::read_model_config(vace).kind == "wan-vace");
  CHECK(kiln::jit::read_model_config(vace).ops == model.ops);
  CHECK(model.ops.at(Op::gelu) == std::vector<std::int64_t>{8960});
  CHECK(model.ops.at(Op::rms_norm_rope) == std::vector<std::int64_t>{1536});
  const auto targets = targets_of(model);
  constexpr std::uint32_t table = kiln::kNormLayer | kiln::kNormTable | kiln::kNormTableF32;
  for (Op op : {Op::adaln, Op::gated_adaln}) {
    CHECK(prewarmed_flags(targets, op, 1536, kiln::DType::bf16) ==
          std::vector<std::uint32_t>{table, table | kiln::kNormPerToken});
  }
}
