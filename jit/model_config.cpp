#include "jit/model_config.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "cache/error.h"
#include "cache/file_io.h"
#include "templates/norm_family.h"
#include "templates/rope_family.h"

namespace kiln::jit {
namespace {

// `section`: the part of config.json `config` is, for the message ("vision_config: "; empty at
// the top level).
std::int64_t require_size(const nlohmann::json& config, const char* key,
                          std::string_view section = {}) {
  const auto it = config.find(key);
  if (it == config.end() || !it->is_number_integer() || it->get<std::int64_t>() <= 0) {
    throw Error("kiln prewarm: config.json: " + std::string(section) + "\"" + key +
                "\": expected a positive integer" +
                (it == config.end() ? std::string(", but it is missing") : ", got " + it->dump()));
  }
  return it->get<std::int64_t>();
}

// The size at `key` where the config sets it (a key absent or null: nullopt); a value that is
// set must be a positive integer.
std::optional<std::int64_t> size_if_set(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    return std::nullopt;
  }
  return require_size(config, key);
}

// size_if_set's size, with a 0 read as absent too: GLM-5 Next writes 0 for the sizes its
// attention has no use for (head_dim, qk_rope_head_dim).
std::optional<std::int64_t> size_unless_zero(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it != config.end() && it->is_number_integer() && it->get<std::int64_t>() == 0) {
    return std::nullopt;
  }
  return size_if_set(config, key);
}

// Adds `size` to an op's sizes unless it is there already.
void add_size(std::vector<std::int64_t>& sizes, std::int64_t size) {
  if (std::find(sizes.begin(), sizes.end(), size) == sizes.end()) {
    sizes.push_back(size);
  }
}

std::string text_of(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  return it != config.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// transformers' models whose attention RMS-normalises each head of q and k right before RoPE,
// which kiln's patch runs as one head_norm_rope.
bool normalises_heads(const std::string& model_type) {
  static const std::set<std::string, std::less<>> kTypes = {
      "qwen3",        "qwen3_moe",        "gemma3_text",   "qwen3_next",
      "qwen3_5_text", "qwen3_5_moe_text", "qwen3_vl_text", "qwen3_vl_moe_text"};
  return kTypes.contains(model_type);
}

// apply_rotary_emb's complex frequencies as kiln's patch hands them over: adjacent pairs, the
// real and imaginary parts as an fp32 half table.
constexpr std::uint32_t kRopeComplexFrequencies = kRopeInterleaved | kRopeHalfTable | kRopeTableF32;

// RoPE's table flags for the tables kiln's patch hands kiln.rope from these models'
// attentions (bindings/python/kiln/patching/rope_attention.py's forms): GPT-OSS's
// [.., D / 2] table, one angle a pair; GLM's interleaved pairs, each angle from the first half
// of its table; Llama 4's complex frequencies, adjacent pairs from an fp32 half table (their
// real and imaginary parts). 0 for transformers' usual [.., D] table.
std::uint32_t rope_table_flags(const std::string& model_type) {
  if (model_type == "gpt_oss") {
    return kRopeHalfTable;
  }
  if (model_type == "llama4_text") {
    return kRopeComplexFrequencies;
  }
  if (model_type == "glm" || model_type == "glm4") {
    return kRopeInterleaved | kRopeHalfTable;
  }
  return 0;
}

// Models whose attention slices the rotated columns off each head itself and rotates the slice
// as a whole head (rotary_ndims): their RoPE calls have the rotary dim as their head dim.
bool rotates_a_slice(const std::string& model_type) {
  return model_type == "phi" || model_type == "stablelm" || model_type == "persimmon";
}

// The fraction of each head RoPE rotates, where the config names one: partial_rotary_factor
// (at the top, as config.json files write it, or in transformers 5's rope_parameters) or
// GPT-NeoX's rotary_pct. 1 where it names none.
double rotary_fraction(const nlohmann::json& config) {
  for (const char* key : {"partial_rotary_factor", "rotary_pct"}) {
    if (auto it = config.find(key); it != config.end() && !it->is_null()) {
      if (!it->is_number() || it->get<double>() <= 0 || it->get<double>() > 1) {
        throw Error(std::string("kiln prewarm: config.json: \"") + key +
                    "\": expected a number in (0, 1], got " + it->dump());
      }
      return it->get<double>();
    }
  }
  if (auto rope = config.find("rope_parameters"); rope != config.end() && rope->is_object()) {
    return rotary_fraction(*rope);
  }
  return 1.0;
}

// The columns of a head of `head_dim` RoPE rotates: int(head_dim * fraction), as transformers'
// rotary embeddings size their tables; 0 for the whole head.
std::int64_t rotary_dim_of(const nlohmann::json& config, std::int64_t head_dim) {
  const double fraction = rotary_fraction(config);
  const auto rotary = static_cast<std::int64_t>(static_cast<double>(head_dim) * fraction);
  if (rotary == head_dim) {
    return 0;
  }
  if (rotary < 2 || rotary % 2 != 0) {
    throw Error("kiln prewarm: config.json: a partial rotation of " + std::to_string(fraction) +
                " of head_dim " + std::to_string(head_dim) + " rotates " + std::to_string(rotary) +
                " columns; RoPE rotates pairs (an even count of at least 2)");
  }
  return rotary;
}

// The channels of a Mamba-2 mixer (mamba_expand x hidden, Nemotron-H's heads x head dim, or
// Falcon-H1's mamba_d_ssm) and their groups, where the config describes one; 0 channels where
// it does not.
std::pair<std::int64_t, std::int64_t> mamba_channels(const nlohmann::json& config,
                                                     std::int64_t hidden) {
  std::int64_t channels = 0;
  if (const auto ssm = size_if_set(config, "mamba_d_ssm")) {
    channels = *ssm;
  } else if (config.contains("mamba_num_heads") && config.contains("mamba_head_dim")) {
    channels = require_size(config, "mamba_num_heads") * require_size(config, "mamba_head_dim");
  } else if (auto expand = config.find("mamba_expand");
             expand != config.end() && expand->is_number()) {
    channels = static_cast<std::int64_t>(expand->get<double>() * static_cast<double>(hidden));
  }
  std::int64_t groups = 1;
  for (const char* key : {"mamba_n_groups", "mamba_ngroups", "n_groups"}) {
    if (const auto set = size_if_set(config, key)) {
      groups = *set;
      break;
    }
  }
  return {channels, groups};
}

// Multi-head latent attention (DeepSeek-V3, GLM-4.7-Flash, Mistral 4, ...) rotates the last
// qk_rope_head_dim columns of each q head and one k head that all share: kiln's patch hands
// kiln.rope those views, heads inner, with the model's table. Where rope_interleave is set
// (transformers' default) as adjacent pairs written de-interleaved, from the first half of the
// table; where the config does not say, the model's code decides, so both forms.
void multi_head_latent_rope(const nlohmann::json& config, std::int64_t width, ModelShape& model) {
  constexpr std::uint32_t kPairs = kRopeDeinterleave | kRopeHalfTable;
  const auto interleave = config.find("rope_interleave");
  if (model.kind == "deepseek_v2") {
    // DeepSeek-V2 turns its pairs by complex frequencies, not a cos/sin table.
    model.rope_tables = {kRopeComplexFrequencies};
    model.heads_k = 1;
    model.rotary_dim = 0;
    model.rope += ", over the latent attention's " + std::to_string(width) +
                  " rotated columns (one k head), pairs by complex frequencies";
    return;
  }
  if (interleave != config.end() && interleave->is_boolean()) {
    model.rope_tables = {interleave->get<bool>() ? kPairs : 0u};
  } else {
    model.rope_tables = {kPairs, 0u};
  }
  model.heads_k = 1;
  model.rotary_dim = 0;
  model.rope +=
      ", over the latent attention's " + std::to_string(width) + " rotated columns (one k head), " +
      (model.rope_tables.size() == 2    ? "pairs de-interleaved first or not, as its code says"
       : model.rope_tables[0] == kPairs ? "pairs de-interleaved first"
                                        : "not de-interleaved");
}

// Falcon-H1's mixer closes its scan with a gated RMSNorm only where mamba_rms_norm is set, over
// its channels (mamba_channels), the gate after the norm unless mamba_norm_before_gate is false.
// Its norm keeps its groups in n_groups, which kiln's patch leaves to transformers but for one
// group: the whole row.
void falcon_h1_gated_norm(const nlohmann::json& config, ModelShape& model) {
  const auto flag = [&](const char* key, bool otherwise) {
    const auto it = config.find(key);
    return it != config.end() && it->is_boolean() ? it->get<bool>() : otherwise;
  };
  const auto [channels, groups] = mamba_channels(config, model.hidden);
  if (!flag("mamba_rms_norm", false) || channels <= 0 || groups != 1) {
    return;
  }
  model.ops[Op::rms_norm_gated] = {channels};
  model.gated_norm_flags =
      kNormWeight | (flag("mamba_norm_before_gate", true) ? 0u : kNormGateFirst);
}

// Inkling 2's language model as kiln's patch takes it: RMSNorms over an fp32 residual stream
// (the decoder layers' norms take fp32 rows with their half weight, the block attention
// residuals' unweighted norms fp32 stacked states), the value heads' unweighted norms in fp32
// (head_dim, and swa_head_dim in its sliding layers), the embedding's norm in the model's
// dtype. It has no RoPE (its attention adds relative-position logits) and no residual add
// before a norm, and its experts' softcapped SwiGLU is left to transformers.
void inkling2_text(const nlohmann::json& config, ModelShape& model) {
  model.ops.erase(Op::rope);
  model.ops.erase(Op::fused_add_rms_norm);
  model.ops.erase(Op::swiglu);
  model.rope = "none (relative-position logits)";
  add_size(model.ops[Op::rms_norm], model.head_dim);
  if (const auto sliding = size_if_set(config, "swa_head_dim")) {
    add_size(model.ops[Op::rms_norm], *sliding);
  }
  model.fp32_ops = {Op::rms_norm};
}

// The keys configs count their routed experts under (Qwen3-MoE's and OLMoE's, DeepSeek's,
// Mixtral's).
constexpr const char* kExpertCounts[] = {"num_experts", "n_routed_experts", "num_local_experts"};

ModelShape read_llm(const nlohmann::json& config) {
  ModelShape model;
  model.kind = text_of(config, "model_type");
  if (model.kind.empty()) {
    model.kind = "llm";
  }
  model.hidden = require_size(config, "hidden_size");
  // The width of routed experts of their own (moe_intermediate_size; Mixtral's are
  // intermediate_size), 0 where there are none.
  const bool routed =
      std::any_of(std::begin(kExpertCounts), std::end(kExpertCounts), [&](const char* key) {
        const auto count = config.find(key);
        return count != config.end() && count->is_number_integer() &&
               count->get<std::int64_t>() > 0;
      });
  const std::int64_t expert_width =
      routed ? size_if_set(config, "moe_intermediate_size").value_or(0) : 0;
  // A model whose every MLP is its routed experts (Inkling 2) has no dense width of its own.
  model.intermediate = expert_width > 0 && !config.contains("intermediate_size")
                           ? expert_width
                           : require_size(config, "intermediate_size");
  if (const auto head_dim = size_unless_zero(config, "head_dim")) {
    model.head_dim = *head_dim;
  } else {
    const std::int64_t heads = require_size(config, "num_attention_heads");
    if (model.hidden % heads != 0) {
      throw Error("kiln prewarm: config.json: hidden_size " + std::to_string(model.hidden) +
                  " is not a multiple of num_attention_heads " + std::to_string(heads));
    }
    model.head_dim = model.hidden / heads;
  }
  // The head counts choose RoPE's kernel; a config that gives head_dim without them keeps the
  // default (counts in fours).
  if (config.contains("num_attention_heads")) {
    const std::int64_t heads_q = require_size(config, "num_attention_heads");
    const std::int64_t heads_k =
        config.contains("num_key_value_heads") && !config.at("num_key_value_heads").is_null()
            ? require_size(config, "num_key_value_heads")
            : heads_q;
    model.heads_q = heads_q;
    model.heads_k = heads_k;
  }
  model.rope = "rotate-half";
  if (auto theta = config.find("rope_theta"); theta != config.end() && theta->is_number()) {
    model.rope += ", rope_theta " + theta->dump();
  }
  if (auto scaling = config.find("rope_scaling"); scaling != config.end() && scaling->is_object()) {
    const std::string type = scaling->value("rope_type", scaling->value("type", std::string()));
    if (!type.empty()) {
      model.rope += ", scaling " + type;
    }
  }
  model.rotary_dim = rotary_dim_of(config, model.head_dim);
  if (model.rotary_dim != 0) {
    model.rope += ", the first " + std::to_string(model.rotary_dim) + " of " +
                  std::to_string(model.head_dim) + " columns";
  }
  model.rope_tables = {rope_table_flags(model.kind)};
  if ((model.rope_tables[0] & kRopeInterleaved) != 0) {
    model.rope += ", interleaved pairs";
  } else if ((model.rope_tables[0] & kRopeHalfTable) != 0) {
    model.rope += ", one angle a pair";
  }
  std::int64_t rope_width = model.head_dim;
  if (rotates_a_slice(model.kind) && model.rotary_dim != 0) {
    rope_width = model.rotary_dim;
    model.rotary_dim = 0;
  }
  if (const auto latent_rope = size_unless_zero(config, "qk_rope_head_dim")) {
    multi_head_latent_rope(config, *latent_rope, model);
    rope_width = *latent_rope;
  }
  model.ops = {
      {Op::rms_norm, {model.hidden}},
      {Op::fused_add_rms_norm, {model.hidden}},
      {Op::swiglu, {model.intermediate}},
      {Op::rope, {rope_width}},
  };
  // An MoE's shared expert of its own width (Qwen's shared_expert_intermediate_size), or n copies
  // of the routed experts' width (DeepSeek-V3's n_shared_experts, Kimi Linear's
  // num_shared_experts): one SwiGLU of that width.
  std::optional<std::int64_t> shared = size_if_set(config, "shared_expert_intermediate_size");
  for (const char* key : {"n_shared_experts", "num_shared_experts"}) {
    if (auto copies = config.find(key); !shared && copies != config.end() &&
                                        copies->is_number_integer() &&
                                        copies->get<std::int64_t>() > 0) {
      if (const auto expert = size_if_set(config, "moe_intermediate_size")) {
        shared = *expert * copies->get<std::int64_t>();
      }
    }
  }
  if (shared && *shared != model.intermediate) {
    model.ops[Op::swiglu].push_back(*shared);
  }
  // transformers' experts implementations gate every routed token's packed gate_up at once,
  // which kiln's patch runs as one SwiGLU of the experts' width.
  if (expert_width > 0) {
    add_size(model.ops[Op::swiglu], expert_width);
  }
  // Llama 4: its dense layers' MLP has a width of its own (its experts and shared expert take
  // intermediate_size), and use_qk_norm normalises each head of q and k (no weight).
  if (const auto dense = size_if_set(config, "intermediate_size_mlp")) {
    add_size(model.ops[Op::swiglu], *dense);
  }
  if (auto qk_norm = config.find("use_qk_norm");
      qk_norm != config.end() && qk_norm->is_boolean() && qk_norm->get<bool>()) {
    add_size(model.ops[Op::rms_norm], model.head_dim);
  }
  if (model.kind == "inkling2_text") {
    inkling2_text(config, model);
  }
  if (model.kind == "gpt_oss") {
    // Every GPT-OSS MLP is its experts, which gate themselves with no act_fn: a clamped SwiGLU
    // over the interleaved pairs of each routed token's packed gate_up, kiln's clamped_swiglu.
    model.ops.erase(Op::swiglu);
    model.ops[Op::clamped_swiglu] = {model.intermediate};
  }
  // Multi-head latent attention (DeepSeek-V3, Kimi Linear) RMS-normalises its compressed kv and,
  // where it has one, its compressed q.
  for (const char* key : {"kv_lora_rank", "q_lora_rank"}) {
    if (const auto width = size_if_set(config, key)) {
      add_size(model.ops[Op::rms_norm], *width);
    }
  }
  // GLM-5 Next: its hyper-connections normalise hc_mult streams of the hidden state as one row
  // (no weight), and its sparse attention's indexer LayerNorms each key (index_head_dim).
  if (const auto streams = size_if_set(config, "hc_mult")) {
    model.ops[Op::rms_norm].push_back(*streams * model.hidden);
  }
  if (const auto index = size_if_set(config, "index_head_dim")) {
    model.ops[Op::layer_norm] = {*index};
  }
  if (normalises_heads(model.kind)) {
    // Fused where no graph is recorded; training calls the head norms on their own.
    model.head_norm_layout = 0u;
    model.rope += ", after the per-head q/k RMSNorms";
    if (model.head_dim != model.hidden) {
      model.ops[Op::rms_norm].push_back(model.head_dim);
    }
  }
  // Qwen3-Next's and Qwen3.5's linear attention closes each value head with a gated RMSNorm.
  if (const auto value_head = size_if_set(config, "linear_value_head_dim")) {
    model.ops[Op::rms_norm_gated] = {*value_head};
  }
  if (model.kind == "kimi_linear" || model.kind == "glm5_next_text") {
    // Their delta attention closes each head (linear_head_dim) with a sigmoid-gated RMSNorm.
    model.ops[Op::rms_norm_gated] = {require_size(config, "linear_head_dim")};
    model.gated_norm_flags = kNormWeight | kNormGateSigmoid;
  } else if (model.kind == "falcon_h1") {
    falcon_h1_gated_norm(config, model);
  } else if (const auto [channels, groups] = mamba_channels(config, model.hidden);
             channels > 0 && channels % groups == 0) {
    // The Mamba-2 mixers of Bamba, Granite 4.0-H, Zamba2 and Nemotron-H close their scan with
    // the gate first, over groups of their channels: kiln's patch normalises a group a row,
    // with the weight where the group is the whole row and after the call where there are
    // several.
    model.ops[Op::rms_norm_gated] = {channels / groups};
    model.gated_norm_flags = kNormGateFirst | (groups == 1 ? kNormWeight : 0u);
  }
  return model;
}

// "<dims> (axes_dims_rope [...]), <how>": the axes a diffusers config's RoPE turns by (under
// `key`), for the summary.
std::string axes_rope(const nlohmann::json& config, const std::string& dims, const std::string& how,
                      const char* key = "axes_dims_rope") {
  std::string text = dims + " (" + key;
  if (auto axes = config.find(key); axes != config.end() && axes->is_array()) {
    text += " " + axes->dump();
  }
  return text + "), " + how;
}

// diffusers' FeedForward default: inner width = 4 x dim (FLUX's single blocks use
// mlp_ratio 4.0 too).
constexpr std::int64_t kDiffusersFeedForwardMult = 4;

// The feed-forwards' inner width, `mlp_ratio` (or `fallback` where the config has none) x hidden,
// truncated as diffusers' int(hidden * mlp_ratio).
std::int64_t mlp_width(const nlohmann::json& config, std::int64_t hidden, double fallback) {
  double ratio = fallback;
  if (auto it = config.find("mlp_ratio"); it != config.end() && it->is_number()) {
    ratio = it->get<double>();
  }
  return static_cast<std::int64_t>(static_cast<double>(hidden) * ratio);
}

// HunyuanVideo (diffusers' HunyuanVideoTransformer3DModel and its FramePack variant) and
// HunyuanVideo 1.5: FLUX's blocks with the video stream first (AdaLN over a LayerNorm with no
// affine, per sample; the double blocks' seams, gated_adaln and the gated residual in place; the
// single blocks' gated residual and GELU written into proj_out's input), each attention's per-head
// q/k RMSNorms and the video tokens' rotation from diffusers' fp32 table (interleaved pairs) as one
// head_norm_rope in place, the text tokens' norms alone; the token refiner's affine LayerNorms.
// HunyuanVideo 1.5 (double blocks only) adds the LayerNorms of its ByT5 and image projections;
// HunyuanImage 2.1 (HunyuanVideo's blocks over an image's 2-D positions) its ByT5 projection's,
// where it has one.
void read_hunyuan_video(const nlohmann::json& config, ModelShape& model) {
  model.heads_q = model.heads_k = model.hidden / model.head_dim;
  model.head_norm_layout = kRopeInterleaved | kRopeTableF32;
  model.modulation_flags = {kNormLayer};
  model.intermediate = mlp_width(config, model.hidden, 4.0);
  model.rope = axes_rope(config, model.kind == "hunyuan-image" ? "2-D" : "3-D",
                         "a table, interleaved pairs, the image or video tokens' alone, after the "
                         "per-head q/k RMSNorms",
                         "rope_axes_dim");
  std::vector<std::int64_t> layer_norms = {model.hidden};
  if (model.kind == "hunyuan-video-1.5") {
    layer_norms.push_back(size_if_set(config, "text_embed_2_dim").value_or(1472));
    layer_norms.push_back(size_if_set(config, "image_embed_dim").value_or(1152));
  } else if (const auto byt5 = size_if_set(config, "text_embed_2_dim");
             byt5 && model.kind == "hunyuan-image") {
    layer_norms.push_back(*byt5);
  }
  model.ops = {
      {Op::layer_norm, layer_norms},     {Op::adaln, {model.hidden}},
      {Op::gated_adaln, {model.hidden}}, {Op::gated_residual, {model.hidden}},
      {Op::gelu, {model.intermediate}},  {Op::rms_norm, {model.head_dim}},
      {Op::rope, {model.head_dim}},
  };
}

// Stable Diffusion 3 and 3.5 (diffusers' SD3Transformer2DModel): FLUX's double-stream block
// under other arguments. Its AdaLN modules over a LayerNorm with no affine (per sample), the
// blocks' seams (gated_adaln, the gated residual in place; SD3.5 Medium's dual-attention blocks
// add the second attention's gated residual out of place, and modulate its norm1's LayerNorm in
// torch), the feed-forwards' tanh GELU of 4x the inner dim; SD3.5's per-head q/k RMSNorms
// (qk_norm "rms_norm"). No RoPE: its positions are learned.
void read_sd3(const nlohmann::json& config, ModelShape& model) {
  model.heads_q = model.heads_k = model.hidden / model.head_dim;
  model.rope = "none (learned positions)";
  model.modulation_flags = {kNormLayer};
  model.ops = {
      {Op::layer_norm, {model.hidden}},  {Op::adaln, {model.hidden}},
      {Op::gated_adaln, {model.hidden}}, {Op::gated_residual, {model.hidden}},
      {Op::gelu, {model.intermediate}},
  };
  if (text_of(config, "qk_norm") == "rms_norm") {
    model.ops[Op::rms_norm] = {model.head_dim};
  }
}

// Mochi (diffusers' MochiTransformer3DModel): a video stream (the inner dim) and a text stream
// (pooled_projection_dim). Each stream's patched block: the AdaLN over an RMSNorm with no weight
// (per sample, no shift), the gated norms of the attention's and the feed-forward's outputs (an
// AdaLN whose scale is the gate plus an fp32 table row), the residual add with the next norm's
// modulation (gated_adaln, fp32 table rows); the feed-forwards' SwiGLU of the packed projection,
// (4 x width x 2) / 3 wide; the per-head q/k RMSNorms, then the rotation by learned per-head
// frequencies: diffusers' fp32 [N, H, D/2] tables read as one half table a token, each token's
// heads rotating as one row (one head of q, one of k). The output AdaLN over a LayerNorm. Where
// autograd records, the blocks are diffusers' (their RMSNorms with no weight, fp32 inputs, at
// each stream's width) and so is the rotation (its frequencies train).
void read_mochi(const nlohmann::json& config, ModelShape& model) {
  const std::int64_t text = size_if_set(config, "pooled_projection_dim").value_or(1536);
  const auto mochi_mlp = [](std::int64_t width) { return 4 * width * 2 / 3; };
  model.intermediate = mochi_mlp(model.hidden);
  model.heads_q = model.heads_k = 1;
  model.rope_tables = {kRopeInterleaved | kRopeTableF32 | kRopeHalfTable};
  model.rope =
      "3-D (frames, height, width) by learned per-head frequencies: diffusers' fp32 tables, "
      "interleaved pairs, each token's heads as one row, after the per-head q/k RMSNorms";
  model.modulation_flags = {0u, kNormTable | kNormTableF32, kNormLayer};
  model.ops = {
      {Op::adaln, {model.hidden, text}},
      {Op::gated_adaln, {model.hidden, text}},
      {Op::rms_norm, {model.head_dim, model.hidden, text}},
      {Op::rope, {model.hidden}},
      {Op::swiglu, {model.intermediate, mochi_mlp(text)}},
  };
  model.fp32_ops = {Op::rms_norm};
}

// LTX-2 and LTX-2.3 (diffusers' LTX2VideoTransformer3DModel): a video stream (the model's
// sizes) and an audio stream (a part of its own). Each stream's patched blocks: AdaLN over an
// RMSNorm with no weight, the table rows beside temb, per sample or per token (conditioned
// frames); the seams (gated_adaln, the gated residual in place); the q/k RMSNorms across the
// heads of each attention, then the rotation. LTX-2's checkpoints rotate each head's halves
// (rope_type "split"): kiln's patch rotates each token's heads as rows of one head with an fp32
// half table, q and k together in the self-attentions and each alone (a partner of no heads, a
// part of its own) in the audio-video attentions. diffusers' default rotates interleaved pairs
// across the row: the self-attentions' norms and rotation as one rms_norm_rope, the
// audio-video attentions' rotation from full-row tables. The output LayerNorms have no affine.
void read_ltx2(const nlohmann::json& config, ModelShape& model) {
  const bool split = text_of(config, "rope_type") == "split";
  const std::int64_t audio_head = size_if_set(config, "audio_attention_head_dim").value_or(64);
  const std::int64_t audio_width =
      audio_head * size_if_set(config, "audio_num_attention_heads").value_or(32);
  const std::uint32_t table =
      split ? (kRopeTableF32 | kRopeHalfTable) : (kRopeInterleaved | kRopeTableF32);
  model.heads_q = model.heads_k = 1;
  model.rope_tables = {table};
  model.modulation_flags = {kNormTable, kNormTable | kNormPerToken};
  model.rope = split ? "video and audio positions, each head's halves by fp32 half tables, "
                       "after the q/k RMSNorms across heads"
                     : "video and audio positions, interleaved pairs across the row by fp32 "
                       "tables, after the q/k RMSNorms across heads";
  ModelShape audio = model;
  audio.kind = "ltx2 audio stream";
  audio.head_dim = audio_head;
  audio.hidden = audio_width;
  audio.intermediate = kDiffusersFeedForwardMult * audio_width;
  for (ModelShape* stream : {&model, &audio}) {
    const std::int64_t width = stream->hidden;
    stream->ops = {
        {Op::rms_norm, {width}},
        {Op::layer_norm, {width}},
        {Op::adaln, {width}},
        {Op::gated_adaln, {width}},
        {Op::gated_residual, {width}},
        {Op::gelu, {stream->intermediate}},
        {Op::rope, {split ? stream->head_dim : width}},
    };
    if (!split) {
      stream->ops[Op::rms_norm_rope] = {width};
    }
  }
  ModelShape across = audio;
  across.kind = "ltx2 audio-video attentions";
  across.heads_k = 0;
  across.ops = {{Op::rope, {split ? audio_head : audio_width}}};
  model.towers = {audio, across};
}

// Qwen-Image's and Qwen-Image 2.1's attention: q and k share the head count; each head's
// RMSNorm and rotation by complex frequencies, read as fp32 half tables (interleaved pairs), one
// head_norm_rope (training: the norms and kiln.rope).
void qwen_image_rotation(const nlohmann::json& config, ModelShape& model) {
  model.heads_q = model.heads_k = model.hidden / model.head_dim;
  constexpr std::uint32_t kComplexTable = kRopeInterleaved | kRopeTableF32 | kRopeHalfTable;
  model.head_norm_layout = kComplexTable;
  model.rope_tables = {kComplexTable};
  model.rope = axes_rope(config, "3-D",
                         "complex frequencies read as fp32 half tables, interleaved pairs, after "
                         "the per-head q/k RMSNorms");
}

ModelShape read_diffusion(const nlohmann::json& config, const std::string& kind) {
  ModelShape model;
  model.kind = kind;
  model.head_dim = require_size(config, "attention_head_dim");
  model.hidden = model.head_dim * require_size(config, "num_attention_heads");
  model.intermediate = kDiffusersFeedForwardMult * model.hidden;
  if (kind == "flux" || kind == "chroma" || kind == "ovis-image") {
    // q and k share the head count; kiln's patch rotates them with diffusers' fp32 table.
    // Chroma's blocks are FLUX's with the modulation projections pruned: the same kernels, its
    // pruned AdaLN modules' too (the rows come from the model's approximator, whose RMSNorms
    // run at its own width). Ovis-Image's are FLUX's with SwiGLU MLPs.
    model.heads_q = model.heads_k = model.hidden / model.head_dim;
    model.head_norm_layout = kRopeInterleaved | kRopeTableF32;
    model.modulation_flags = {kNormLayer};  // AdaLayerNormZero and the double blocks' seams
    model.rope =
        axes_rope(config, "3-D", "a table, interleaved pairs, after the per-head q/k RMSNorms");
    model.ops = {
        {Op::layer_norm, {model.hidden}},  {Op::adaln, {model.hidden}},
        {Op::gated_adaln, {model.hidden}}, {Op::gated_residual, {model.hidden}},
        {Op::gelu, {model.intermediate}},  {Op::rms_norm, {model.head_dim}},
        {Op::rope, {model.head_dim}},
    };
    if (kind == "chroma") {
      add_size(model.ops[Op::rms_norm], require_size(config, "approximator_hidden_dim"));
    }
    if (kind == "ovis-image") {
      // Its feed-forwards and its single blocks' MLPs gate 4x the inner dim (the single blocks'
      // written into proj_out's input); its text input's RMSNorm runs at joint_attention_dim.
      model.ops.erase(Op::gelu);
      model.ops[Op::swiglu] = {model.intermediate};
      add_size(model.ops[Op::rms_norm], require_size(config, "joint_attention_dim"));
    }
  } else if (kind == "cogvideox") {
    // Its patched blocks: each stream's AdaLN over an affine LayerNorm (the weight in the
    // kernel, the bias folded into the shift), per sample; the attention's gated residual with
    // norm2's modulation (gated_adaln) and the feed-forward's gated residual in place; the
    // attention's q/k LayerNorms over each head and the final LayerNorm, with weight and bias.
    // CogVideoX-5b and 1.5 (use_rotary_positional_embeddings) rotate the video tokens' q and k
    // in place, from the pipeline's fp32 tables, interleaved pairs.
    model.heads_q = model.heads_k = model.hidden / model.head_dim;
    model.modulation_flags = {kNormLayer | kNormWeight};
    model.ops = {
        {Op::adaln, {model.hidden}},          {Op::gated_adaln, {model.hidden}},
        {Op::gated_residual, {model.hidden}}, {Op::layer_norm, {model.hidden, model.head_dim}},
        {Op::gelu, {model.intermediate}},
    };
    if (auto rotary = config.find("use_rotary_positional_embeddings");
        rotary != config.end() && rotary->is_boolean() && rotary->get<bool>()) {
      model.rope =
          "3-D (frames, height, width) from the pipeline's fp32 tables, interleaved pairs, the "
          "video tokens' q and k in place after the per-head q/k LayerNorms";
      model.rope_tables = {kRopeInterleaved | kRopeTableF32};
      model.ops[Op::rope] = {model.head_dim};
    } else {
      model.rope = "none (learned positions)";
    }
  } else if (kind == "flux2") {
    // Its patched blocks: each stream's AdaLN over a LayerNorm with no affine from the model's
    // shared modulation (per sample), the double blocks' seams (gated_adaln, the gated residual
    // in place), the single blocks' gated residual; each attention's per-head q/k RMSNorms and
    // rotation from diffusers' fp32 table (interleaved) as one head_norm_rope; the feed-forwards'
    // SwiGLU of the packed projection, mlp_ratio x the inner dim (the single blocks' written into
    // to_out's input).
    model.heads_q = model.heads_k = model.hidden / model.head_dim;
    model.head_norm_layout = kRopeInterleaved | kRopeTableF32;
    model.modulation_flags = {kNormLayer};
    model.intermediate = mlp_width(config, model.hidden, 3.0);  // Flux2Transformer2DModel's default
    model.rope =
        axes_rope(config, "4-D", "a table, interleaved pairs, after the per-head q/k RMSNorms");
    model.ops = {
        {Op::layer_norm, {model.hidden}},   {Op::adaln, {model.hidden}},
        {Op::gated_adaln, {model.hidden}},  {Op::gated_residual, {model.hidden}},
        {Op::swiglu, {model.intermediate}}, {Op::rms_norm, {model.head_dim}},
        {Op::rope, {model.head_dim}},
    };
  } else if (kind == "flux3") {
    // Its patched attentions (the per-mode and the joint blocks'): q's and k's per-head RMSNorms,
    // whose weights the loader keeps in fp32 (kiln takes them rounded to v's dtype), and the
    // rotation from diffusers' fp32 table (interleaved) as one head_norm_rope; where autograd
    // records, diffusers' norms of the fp32 heads (kiln's rms_norm) and kiln.rope of them, both in
    // fp32. Its LayerNorms with no affine; the feed-forwards' SwiGLU of the packed projection,
    // mlp_ratio x the inner dim. Its blocks' seams: each stream's AdaLN over a LayerNorm with no
    // affine and its gated residual, per sample (the modulation heads project one row a sample of
    // the expanded timestep embeddings), per token in the joint blocks' image stream with a
    // reference image (the image's and the reference's modulations concatenated); the output
    // AdaLN per sample.
    model.heads_q = model.heads_k = model.hidden / model.head_dim;
    model.head_norm_layout = kRopeInterleaved | kRopeTableF32;
    model.rope_tables = {kRopeInterleaved | kRopeTableF32};
    model.modulation_flags = {kNormLayer, kNormLayer | kNormPerToken};
    model.fp32_ops = {Op::rms_norm, Op::rope};
    model.intermediate = mlp_width(config, model.hidden, 3.0);  // Flux3Transformer2DModel's default
    model.rope = axes_rope(config, "4-D",
                           "a table, interleaved pairs, after the per-head q/k RMSNorms in fp32");
    model.ops = {
        {Op::layer_norm, {model.hidden}},     {Op::adaln, {model.hidden}},
        {Op::gated_residual, {model.hidden}}, {Op::swiglu, {model.intermediate}},
        {Op::rms_norm, {model.head_dim}},     {Op::rope, {model.head_dim}},
    };
  } else if (kind == "qwen-image") {
    // Its patched blocks: each stream's AdaLN over a LayerNorm with no affine, per sample (per
    // token too for Qwen-Image-Edit-2511's zero_cond_t: the target's and the condition image's
    // tokens take different timesteps), its seams (gated_adaln, the gated residual in place);
    // the attention's per-head q/k RMSNorms and rotation by complex frequencies, read as fp32
    // half tables (interleaved pairs), one head_norm_rope a stream (training: the norms and
    // kiln.rope); the text input's RMSNorm at joint_attention_dim; the output AdaLN.
    qwen_image_rotation(config, model);
    model.modulation_flags = {kNormLayer};
    if (auto zero_cond = config.find("zero_cond_t");
        zero_cond != config.end() && zero_cond->is_boolean() && zero_cond->get<bool>()) {
      model.modulation_flags->push_back(kNormLayer | kNormPerToken);
    }
    model.ops = {
        {Op::layer_norm, {model.hidden}},
        {Op::adaln, {model.hidden}},
        {Op::gated_adaln, {model.hidden}},
        {Op::gated_residual, {model.hidden}},
        {Op::gelu, {model.intermediate}},
        {Op::rms_norm, {model.head_dim, require_size(config, "joint_attention_dim")}},
        {Op::rope, {model.head_dim}},
    };
  } else if (kind == "qwen-image-2.1") {
    // One stream. Its patched blocks: AdaLN over a LayerNorm with no affine, scale only (a shift
    // of zeros), its seams (gated_adaln, the gated residual in place), per token with
    // causal_condition (the prompt's tokens modulated from t = 0, the image's from the step's t;
    // the model's default), else per sample; the feed-forwards' SwiGLU of mlp_ratio x the inner
    // dim; the attention's per-head q/k RMSNorms and rotation by complex frequencies, read as
    // fp32 half tables (interleaved pairs), one head_norm_rope (training: the norms and
    // kiln.rope); the text input's RMSNorm at context_in_dim; the output LayerNorm.
    qwen_image_rotation(config, model);
    model.intermediate = mlp_width(config, model.hidden, 3.0);
    const auto causal = config.find("causal_condition");
    const bool per_token = causal == config.end() || !causal->is_boolean() || causal->get<bool>();
    model.modulation_flags = {per_token ? kNormLayer | kNormPerToken : kNormLayer};
    model.ops = {
        {Op::layer_norm, {model.hidden}},
        {Op::adaln, {model.hidden}},
        {Op::gated_adaln, {model.hidden}},
        {Op::gated_residual, {model.hidden}},
        {Op::swiglu, {model.intermediate}},
        {Op::rms_norm, {model.head_dim, require_size(config, "context_in_dim")}},
        {Op::rope, {model.head_dim}},
    };
  } else if (kind == "ltx2") {
    read_ltx2(config, model);
  } else if (kind.starts_with("hunyuan-")) {
    read_hunyuan_video(config, model);
  } else if (kind == "mochi") {
    read_mochi(config, model);
  } else if (kind == "sd3") {
    read_sd3(config, model);
  } else if (kind == "wan" || kind == "wan-vace" || kind == "skyreels-v2") {
    // Wan VACE's control blocks are Wan's blocks over the control stream; SkyReels-V2's are
    // Wan's (its self-attention masked across frame blocks; its diffusion forcing modulates
    // each token, as Wan 2.2's TI2V does).
    model.intermediate = require_size(config, "ffn_dim");
    model.heads_q = model.heads_k = model.hidden / model.head_dim;
    model.rope =
        "3-D (frames, height, width), diffusers' fp32 tables read as half tables, "
        "interleaved pairs, after the q/k RMSNorms across heads";
    // Where autograd records, the norms and kiln.rope of q and k as the attention hands them
    // over ([B, S, H, D]).
    model.rope_tables = {kRopeInterleaved | kRopeTableF32 | kRopeHalfTable};
    model.rms_norm_rope_half_table = model.head_dim;
    constexpr std::uint32_t kWanModulation = kNormLayer | kNormTable | kNormTableF32;
    model.modulation_flags = {kWanModulation, kWanModulation | kNormPerToken};
    model.fp32_ops = {Op::layer_norm};
    model.ops = {
        {Op::layer_norm, {model.hidden}},    {Op::adaln, {model.hidden}},
        {Op::gated_adaln, {model.hidden}},   {Op::rms_norm, {model.hidden}},
        {Op::rms_norm_rope, {model.hidden}}, {Op::gelu, {model.intermediate}},
        {Op::rope, {model.head_dim}},
    };
    // Image to video (and first-last frame): the image embedder's LayerNorms (fp32) at the
    // image width and the inner dim, and its GELU (erf) at the image width.
    if (const auto image_dim = size_if_set(config, "image_dim")) {
      model.ops[Op::layer_norm].push_back(*image_dim);
      model.ops[Op::gelu].push_back(*image_dim);
    }
  } else {
    model.rope =
        "3-D (frames, height, width), interleaved pairs, after the q/k RMSNorms "
        "across heads";
    model.modulation_flags = {kNormTable, kNormTable | kNormPerToken};
    model.ops = {
        {Op::rms_norm, {model.hidden}},       {Op::layer_norm, {model.hidden}},
        {Op::adaln, {model.hidden}},          {Op::gated_adaln, {model.hidden}},
        {Op::gated_residual, {model.hidden}}, {Op::rms_norm_rope, {model.hidden}},
        {Op::gelu, {model.intermediate}},     {Op::rope_3d, {model.head_dim}},
    };
  }
  return model;
}

// Stable Audio 3 (diffusers' StableAudio3DiTModel, its defaults where the config has none): its
// RMSNorms (the scale named gamma) at the model's width and at each head's (the differential
// attentions' q/k norms), its blocks' seams (AdaLN and gated residuals over those norms), and its
// feed-forwards' SwiGLU over one packed projection, up first, ff_mult x the width (truncated as
// diffusers' int(dim * mult)).
ModelShape read_stable_audio3(const nlohmann::json& config) {
  ModelShape model;
  model.kind = "stable-audio-3";
  model.hidden = size_if_set(config, "embed_dim").value_or(1536);
  const std::int64_t heads = size_if_set(config, "num_heads").value_or(24);
  if (heads <= 0 || model.hidden % heads != 0) {
    throw Error(
        "kiln prewarm: config.json: expected embed_dim divisible by num_heads, got embed_dim " +
        std::to_string(model.hidden) + " and num_heads " + std::to_string(heads));
  }
  model.head_dim = model.hidden / heads;
  double mult = 4.0;
  if (auto it = config.find("ff_mult"); it != config.end() && it->is_number()) {
    mult = it->get<double>();
  }
  model.intermediate = static_cast<std::int64_t>(static_cast<double>(model.hidden) * mult);
  model.modulation_flags = {kNormWeight};  // each seam's norm scaled by its gamma, per sample
  model.ops = {{Op::rms_norm, {model.hidden, model.head_dim}},
               {Op::adaln, {model.hidden}},
               {Op::gated_adaln, {model.hidden}},
               {Op::gated_residual, {model.hidden}},
               {Op::swiglu, {model.intermediate}}};
  return model;
}

// Z-Image (diffusers' ZImageTransformer2DModel: Z-Image, Z-Image-Turbo, Z-Image-Omni with
// siglip_feat_dim). Its patched modulated blocks: AdaLN over an RMSNorm with its weight (no shift,
// no table), per sample or per token (Omni's noisy and clean tokens); the attention's gated
// residual with the feed-forward's modulated norm (gated_adaln); the feed-forward's gated residual
// in place; the sublayers' output RMSNorms and the caption (and SigLIP) embedder's. Each
// attention's per-head q/k RMSNorms and rotation by complex frequencies read as fp32 half tables,
// interleaved pairs, in one head_norm_rope (training: the norms and kiln.rope); each feed-forward's
// SwiGLU of two projections, dim / 3 * 8 wide; the final LayerNorm with no affine.
ModelShape read_z_image(const nlohmann::json& config) {
  ModelShape model;
  model.kind = "z-image";
  model.hidden = size_if_set(config, "dim").value_or(3840);
  const std::int64_t heads = size_if_set(config, "n_heads").value_or(30);
  if (model.hidden % heads != 0) {
    throw Error("kiln prewarm: config.json: expected dim divisible by n_heads, got dim " +
                std::to_string(model.hidden) + " and n_heads " + std::to_string(heads));
  }
  model.head_dim = model.hidden / heads;
  model.intermediate = model.hidden * 8 / 3;  // diffusers: int(dim / 3 * 8)
  model.heads_q = model.heads_k = heads;
  constexpr std::uint32_t kComplexTable = kRopeInterleaved | kRopeTableF32 | kRopeHalfTable;
  model.head_norm_layout = kComplexTable;
  model.rope_tables = {kComplexTable};
  model.rope = axes_rope(config, "3-D",
                         "complex frequencies read as fp32 half tables, interleaved pairs, after "
                         "the per-head q/k RMSNorms",
                         "axes_dims");
  model.modulation_flags = {kNormWeight, kNormWeight | kNormPerToken};
  std::vector<std::int64_t> norms = {model.hidden, model.head_dim,
                                     size_if_set(config, "cap_feat_dim").value_or(2560)};
  if (const auto siglip = size_if_set(config, "siglip_feat_dim")) {
    norms.push_back(*siglip);
  }
  model.ops = {
      {Op::rms_norm, norms},
      {Op::layer_norm, {model.hidden}},
      {Op::adaln, {model.hidden}},
      {Op::gated_adaln, {model.hidden}},
      {Op::gated_residual, {model.hidden}},
      {Op::swiglu, {model.intermediate}},
      {Op::rope, {model.head_dim}},
  };
  return model;
}

// The vision towers of multimodal models kiln's patch takes (bindings/python/kiln/patching:
// vision_rope.py, gelu_mlp.py), by the tower's model_type (its vision_config's, "_vision"
// dropped, else the model's): the norm of its blocks, whether its MLP is gated (gate, up and
// down projections: SwiGLU) or two layers around its activation (GELU), the config key of the
// MLP's width, whether its attention rotates q and k (apply_rotary_pos_emb_vision), and a
// merger's norm of another kind and width where it has one (GLM-4V's LayerNorm after its
// projection to out_hidden_size; its merger's own gated MLP, beside that projection, is left),
// and how its RoPE rotates.
struct VisionTower {
  const char* model_type;
  Op norm;
  bool gated;
  const char* width;      // the config key of the blocks' width
  const char* mlp_width;  // the config key of the MLP's width, or "mlp_ratio": width x mlp_ratio
  bool rope;
  Op merger_norm = Op::layer_norm;
  const char* merger_norm_width = nullptr;  // a config key, or none
  // RoPE's flags for the table its attention hands over: the Qwen towers' fp32 one of
  // rotate_half's halves, MiniMax-M3-VL's of the tower's dtype (0), Inkling 2's fp32 one of
  // interleaved pairs (rotate_pairwise).
  std::uint32_t rope_table = kRopeTableF32;
  // Its RoPE rotates three axes' even thirds of each head (MiniMax-M3-VL's 3-D RoPE: 2 x (D / 3
  // / 2) columns an axis, 78 of 80), the rest passed through.
  bool axial_thirds = false;
};
constexpr VisionTower kVisionTowers[] = {
    // Qwen2-VL's tower is embed_dim wide; its hidden_size is the merger's output.
    {"qwen2_vl", Op::layer_norm, false, "embed_dim", "mlp_ratio", true},
    {"qwen2_5_vl", Op::rms_norm, true, "hidden_size", "intermediate_size", true},
    {"qwen3_vl", Op::layer_norm, false, "hidden_size", "intermediate_size", true},
    {"qwen3_vl_moe", Op::layer_norm, false, "hidden_size", "intermediate_size", true},
    {"qwen3_5", Op::layer_norm, false, "hidden_size", "intermediate_size", true},
    {"qwen3_5_moe", Op::layer_norm, false, "hidden_size", "intermediate_size", true},
    {"glm4v", Op::rms_norm, true, "hidden_size", "out_hidden_size", true, Op::layer_norm,
     "out_hidden_size"},
    {"glm4v_moe", Op::rms_norm, true, "hidden_size", "out_hidden_size", true, Op::layer_norm,
     "out_hidden_size"},
    {"siglip", Op::layer_norm, false, "hidden_size", "intermediate_size", false},
    {"siglip2", Op::layer_norm, false, "hidden_size", "intermediate_size", false},
    {"minimax_m3_vl", Op::layer_norm, false, "hidden_size", "intermediate_size", true,
     Op::layer_norm, nullptr, 0u, true},
    {"inkling2", Op::layer_norm, false, "hidden_size", "intermediate_size", true, Op::layer_norm,
     nullptr, kRopeInterleaved | kRopeTableF32},
};

std::string tower_type(const nlohmann::json& vision, const std::string& parent_kind) {
  std::string type = text_of(vision, "model_type");
  if (type.empty()) {
    type = parent_kind;
  }
  for (const std::string suffix : {"_vision_model", "_vision"}) {
    if (type.size() > suffix.size() && type.ends_with(suffix)) {
      return type.substr(0, type.size() - suffix.size());
    }
  }
  return type;
}

// A multimodal model's vision tower as kiln's patch runs it, where its config has one of
// kVisionTowers: its norms at its width, its MLP's SwiGLU or GELU (not QuickGELU, which the
// patch leaves), and RoPE over each head from the tower's table, q and k with its head count
// each. None where it has none of them; two where transformers' releases run its RoPE in two
// forms from the same config (MiniMax-M3-VL's), the second with RoPE alone.
std::vector<ModelShape> read_vision_tower(const nlohmann::json& config,
                                          const std::string& parent_kind) {
  const auto vision = config.find("vision_config");
  if (vision == config.end() || !vision->is_object()) {
    return {};
  }
  const std::string type = tower_type(*vision, parent_kind);
  const auto* rule = std::find_if(std::begin(kVisionTowers), std::end(kVisionTowers),
                                  [&](const VisionTower& t) { return type == t.model_type; });
  if (rule == std::end(kVisionTowers)) {
    return {};
  }
  ModelShape tower;
  tower.kind = type + " vision tower";
  constexpr std::string_view kSection = "vision_config: ";
  tower.hidden = require_size(*vision, rule->width, kSection);
  if (rule->mlp_width == std::string_view("mlp_ratio")) {
    const auto ratio = vision->find("mlp_ratio");
    const double value = ratio != vision->end() && ratio->is_number() ? ratio->get<double>() : 4.0;
    tower.intermediate = static_cast<std::int64_t>(static_cast<double>(tower.hidden) * value);
  } else {
    tower.intermediate = require_size(*vision, rule->mlp_width, kSection);
  }
  const char* heads_key = vision->contains("num_heads") ? "num_heads" : "num_attention_heads";
  const std::int64_t heads = require_size(*vision, heads_key, kSection);
  if (tower.hidden % heads != 0) {
    throw Error("kiln prewarm: config.json: vision_config: the width " +
                std::to_string(tower.hidden) + " is not a multiple of " + heads_key + " " +
                std::to_string(heads));
  }
  tower.head_dim = tower.hidden / heads;
  tower.heads_q = tower.heads_k = heads;
  tower.ops[rule->norm] = {tower.hidden};
  if (rule->merger_norm_width != nullptr) {
    add_size(tower.ops[rule->merger_norm],
             require_size(*vision, rule->merger_norm_width, kSection));
  }
  // Qwen3-VL's deepstack mergers normalise the 2 x 2 patches they merge as one row.
  if (auto deepstack = vision->find("deepstack_visual_indexes");
      deepstack != vision->end() && deepstack->is_array() && !deepstack->empty()) {
    const std::int64_t merge = size_if_set(*vision, "spatial_merge_size").value_or(2);
    add_size(tower.ops[rule->norm], tower.hidden * merge * merge);
  }
  const std::string act = text_of(*vision, "hidden_act");
  if (rule->gated && act == "silu") {
    tower.ops[Op::swiglu] = {tower.intermediate};
  } else if (!rule->gated && act.starts_with("gelu")) {
    tower.ops[Op::gelu] = {tower.intermediate};
  }
  if (rule->rope) {
    tower.rope = std::string((rule->rope_table & kRopeInterleaved) != 0 ? "interleaved pairs"
                                                                        : "rotate-half") +
                 " over each head, " +
                 ((rule->rope_table & kRopeTableF32) != 0 ? "an fp32 table"
                                                          : "a table of the tower's dtype");
    if (rule->axial_thirds) {
      tower.rotary_dim = std::int64_t{3} * 2 * (tower.head_dim / 3 / 2);
      tower.rope += ", the first " + std::to_string(tower.rotary_dim) + " of " +
                    std::to_string(tower.head_dim) + " columns";
    }
    tower.rope += " (apply_rotary_pos_emb_vision)";
    tower.rope_tables = {rule->rope_table};
    tower.ops[Op::rope] = {tower.head_dim};
  } else {
    tower.rope = "none";
  }
  if (!rule->axial_thirds) {
    return {tower};
  }
  // transformers releases before MiniMax-M3-VL's 3-D RoPE (5.17's) rotate each whole head by a
  // 2-D RoPE from the same config: the model's code decides, so both forms.
  ModelShape whole = tower;
  whole.kind += ", as earlier transformers rotate it";
  whole.rotary_dim = 0;
  whole.rope = "rotate-half over each whole head, a table of the tower's dtype";
  whole.ops = {{Op::rope, {tower.head_dim}}};
  return {tower, whole};
}

bool is_norm(Op op) {
  switch (op) {
    case Op::rms_norm:
    case Op::fused_add_rms_norm:
    case Op::layer_norm:
    case Op::adaln:
    case Op::gated_adaln:
    case Op::rms_norm_gated:
    case Op::gated_residual:
    case Op::rms_norm_backward:
    case Op::fused_add_rms_norm_backward:
    case Op::layer_norm_backward:
    case Op::adaln_backward:
      return true;
    default:
      return false;
  }
}

}  // namespace

ModelShape read_model_config(const nlohmann::json& config) {
  if (!config.is_object()) {
    throw Error("kiln prewarm: config.json: expected a JSON object");
  }
  const std::string class_name = text_of(config, "_class_name");
  if (class_name == "ZImageTransformer2DModel") {
    return read_z_image(config);
  }
  if (class_name == "StableAudio3DiTModel") {
    return read_stable_audio3(config);
  }
  // diffusers' transformers, by the class that wrote the config
  for (const auto& [diffusers_class, kind] :
       {std::pair{"LTXVideoTransformer3DModel", "ltx-video"},
        std::pair{"FluxTransformer2DModel", "flux"}, std::pair{"WanTransformer3DModel", "wan"},
        // FLUX's copies: the same blocks and attention (Ovis-Image's MLPs gated)
        std::pair{"BriaTransformer2DModel", "flux"},
        std::pair{"BriaFiboTransformer2DModel", "flux"},
        std::pair{"LongCatImageTransformer2DModel", "flux"},
        std::pair{"OvisImageTransformer2DModel", "ovis-image"},
        std::pair{"CogVideoXTransformer3DModel", "cogvideox"},
        std::pair{"QwenImageTransformer2DModel", "qwen-image"},
        std::pair{"QwenImage21Transformer2DModel", "qwen-image-2.1"},
        std::pair{"Flux2Transformer2DModel", "flux2"},
        std::pair{"Flux3Transformer2DModel", "flux3"},
        std::pair{"LTX2VideoTransformer3DModel", "ltx2"},
        std::pair{"HunyuanVideoTransformer3DModel", "hunyuan-video"},
        std::pair{"HunyuanVideoFramepackTransformer3DModel", "hunyuan-video"},
        std::pair{"HunyuanVideo15Transformer3DModel", "hunyuan-video-1.5"},
        std::pair{"HunyuanImageTransformer2DModel", "hunyuan-image"},
        std::pair{"MochiTransformer3DModel", "mochi"}, std::pair{"SD3Transformer2DModel", "sd3"},
        std::pair{"ChromaTransformer2DModel", "chroma"},
        std::pair{"SkyReelsV2Transformer3DModel", "skyreels-v2"},
        std::pair{"WanVACETransformer3DModel", "wan-vace"}}) {
    if (class_name == diffusers_class) {
      return read_diffusion(config, kind);
    }
  }
  // A multimodal model (Qwen3.5, Qwen3-VL, Gemma 3): kiln's patch takes its language model
  // (its text_config, or the top level where older configs keep it) and its vision tower.
  std::optional<ModelShape> model;
  if (config.contains("hidden_size")) {
    model = read_llm(config);
  } else if (auto text = config.find("text_config");
             text != config.end() && text->is_object() && text->contains("hidden_size")) {
    model = read_llm(*text);
  }
  if (model) {
    model->towers = read_vision_tower(config, text_of(config, "model_type"));
    return *model;
  }
  throw Error(
      "kiln prewarm: config.json: expected a transformers LLM config (hidden_size, "
      "intermediate_size, ...) or a diffusers LTXVideoTransformer3DModel, "
      "LTX2VideoTransformer3DModel, FluxTransformer2DModel (or Bria's, Bria FIBO's, "
      "LongCat-Image's, Ovis-Image's), Flux2Transformer2DModel, "
      "Flux3Transformer2DModel, "
      "WanTransformer3DModel, CogVideoXTransformer3DModel, QwenImageTransformer2DModel, "
      "QwenImage21Transformer2DModel, "
      "HunyuanVideoTransformer3DModel, HunyuanVideo15Transformer3DModel, "
      "HunyuanImageTransformer2DModel, MochiTransformer3DModel, SD3Transformer2DModel, "
      "ChromaTransformer2DModel, SkyReelsV2Transformer3DModel, WanVACETransformer3DModel, "
      "ZImageTransformer2DModel or StableAudio3DiTModel config, got " +
      (class_name.empty() ? std::string("neither") : "_class_name \"" + class_name + "\""));
}

nlohmann::json read_config_file(const std::filesystem::path& path, const std::string& who) {
  namespace fs = std::filesystem;
  std::error_code ignored;
  fs::path file = path;
  if (fs::is_directory(path, ignored)) {
    const bool pipeline = fs::exists(path / "model_index.json", ignored) &&
                          !fs::exists(path / "config.json", ignored);
    file = pipeline ? path / "transformer" / "config.json" : path / "config.json";
  }
  const detail::FileRead read = detail::read_whole_file(file);
  if (read.status != detail::ReadStatus::ok) {
    throw Error(who + ": cannot open " + file.string());
  }
  auto document = nlohmann::json::parse(read.bytes.begin(), read.bytes.end(), nullptr,
                                        /*allow_exceptions=*/false);
  if (document.is_discarded()) {
    throw Error(who + ": " + file.string() + " is not JSON");
  }
  return document;
}

PrewarmModel prewarm_model(const ModelShape& model, bool training) {
  return PrewarmModel{.heads_q = model.heads_q,
                      .heads_k = model.heads_k,
                      .training = training,
                      .head_norm_layout = model.head_norm_layout,
                      .rotary_dim = model.rotary_dim,
                      .rope_tables = model.rope_tables,
                      .gated_norm_flags = model.gated_norm_flags,
                      .modulation_flags = model.modulation_flags,
                      .rms_norm_rope_half_table = model.rms_norm_rope_half_table,
                      .fp32_ops = model.fp32_ops};
}

std::map<Op, std::vector<std::int64_t>> sizes_for_ops(const ModelShape& model,
                                                      const std::vector<Op>& ops) {
  if (ops.empty()) {
    return model.ops;
  }
  std::map<Op, std::vector<std::int64_t>> sizes;
  for (Op op : ops) {
    if (auto it = model.ops.find(op); it != model.ops.end()) {
      sizes[op] = it->second;
    } else if (is_norm(op)) {
      sizes[op] = {model.hidden};
    } else if (op == Op::rope || op == Op::rope_3d || op == Op::rms_norm_rope) {
      sizes[op] = {model.head_dim};
    } else {
      sizes[op] = {model.intermediate};
    }
  }
  return sizes;
}

std::vector<PrewarmTarget> model_targets(const ModelShape& model, const std::vector<Op>& ops,
                                         const std::vector<DType>& dtypes,
                                         const std::vector<int>& archs, bool training,
                                         std::vector<std::string>& notes) {
  const auto sizes = sizes_for_ops(model, ops);
  std::vector<Op> chosen;
  chosen.reserve(sizes.size());
  for (const auto& [op, list] : sizes) {
    chosen.push_back(op);
  }
  auto targets =
      expand_targets(chosen, dtypes, sizes, archs, notes, prewarm_model(model, training));
  // A tower's own ops only (of `ops`, where given): the generic sizes are the language model's.
  for (const ModelShape& tower : model.towers) {
    std::vector<Op> own;
    for (const auto& [op, list] : tower.ops) {
      if (ops.empty() || std::find(ops.begin(), ops.end(), op) != ops.end()) {
        own.push_back(op);
      }
    }
    if (own.empty()) {
      continue;
    }
    for (const auto& target : expand_targets(own, dtypes, sizes_for_ops(tower, own), archs, notes,
                                             prewarm_model(tower, training))) {
      if (std::find(targets.begin(), targets.end(), target) == targets.end()) {
        targets.push_back(target);
      }
    }
  }
  return targets;
}

}  // namespace kiln::jit
