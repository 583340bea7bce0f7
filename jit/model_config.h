// Reading a Hugging Face config.json for `kiln prewarm --config`: which kiln ops a model uses
// and at which sizes. Known layouts:
//  - transformers LLMs (Llama, Mistral, Qwen2 and others with the same keys): hidden_size,
//    intermediate_size, head_dim (else hidden_size / num_attention_heads); RoPE rotates halves
//    of each head (rope_theta, rope_scaling are reported). Qwen3, Qwen3-MoE and Gemma 3
//    (model_type qwen3, qwen3_moe, gemma3_text) RMS-normalise each head of q and k first: an
//    RMSNorm of the head dim too, and the norms and rotation as one head_norm_rope where kiln's
//    patch can; so do Qwen3-Next, Qwen3.5 and Qwen3-VL (qwen3_next, qwen3_5_text,
//    qwen3_5_moe_text, qwen3_vl_text, qwen3_vl_moe_text). A partial rotation
//    (partial_rotary_factor, at the top or in rope_parameters, or rotary_pct) rotates the first
//    int(head_dim * factor) columns, as transformers computes it; an MoE's shared expert
//    (shared_expert_intermediate_size) is a SwiGLU of its own size, and so are its routed
//    experts (moe_intermediate_size, where num_experts, n_routed_experts or num_local_experts
//    counts them; a config with those and no intermediate_size has no dense MLP). Inkling 2's
//    language model (inkling2_text): RMSNorms at hidden_size and its value heads' widths, in
//    fp32 too (its residual stream is fp32), no RoPE, its experts' softcapped SwiGLU left.
//    A multimodal config's
//    language model is read from its text_config (or its top level), and its vision_config's
//    tower, where it is Qwen2-VL's, Qwen2.5-VL's, Qwen3-VL's, Qwen3.5's, GLM-4V's,
//    MiniMax-M3-VL's, Inkling 2's or SigLIP's (Gemma 3, PaliGemma), into ModelShape::towers:
//    its norms (RMSNorm or LayerNorm) at its width (and Qwen3-VL's deepstack mergers' at 4x,
//    GLM-4V's merger's LayerNorm at out_hidden_size), its MLP's SwiGLU or GELU, and RoPE over
//    each of its heads from its table (not SigLIP's). Tables as kiln's patch hands them to
//    kiln.rope: GPT-OSS's one angle a pair, GLM's (glm, glm4) interleaved pairs from half its
//    table; Phi-2, StableLM and Persimmon slice the rotated columns off and rotate that slice
//    as a whole head (RoPE at the rotary dim). The gated RMSNorm of linear attentions
//    (linear_value_head_dim; Kimi Linear's and GLM-5 Next's linear_head_dim, a sigmoid gate;
//    GLM-5 Next's hc_mult x hidden hyper-connection norm and index_head_dim LayerNorm) and of
//    Mamba-2 mixers (Bamba, Granite 4.0-H, Zamba2, Nemotron-H, Falcon-H1 where mamba_rms_norm is
//    set), at the width kiln's patch normalises a row. Multi-head latent attention (DeepSeek-V3,
//    Kimi Linear): RMSNorms at kv_lora_rank and q_lora_rank; shared experts of
//    moe_intermediate_size x n_shared_experts (num_shared_experts): one more SwiGLU width.
//  - diffusers LTXVideoTransformer3DModel: inner dim = num_attention_heads * attention_head_dim;
//    AdaLN over an RMSNorm of the inner dim from the blocks' tables (temb per sample, or per
//    token where frames are conditioned), the "rms_norm_across_heads" q/k norms and 3-D RoPE
//    as one rms_norm_rope with the angles from the video grid, RMSNorm q/k norms in
//    cross-attention, a GELU (tanh) feed-forward of 4x the inner dim, gated residuals, a
//    LayerNorm with no affine before the output.
//  - diffusers WanTransformer3DModel (Wan 2.1, Wan 2.2): the same inner dim; AdaLN over a
//    LayerNorm from the blocks' fp32 tables (per sample, or per token for Wan 2.2's TI2V),
//    the q/k norms across heads and RoPE as one rms_norm_rope from diffusers' fp32 tables read
//    as half tables (the norms and kiln.rope when training), RMSNorm q/k norms in
//    cross-attention, a GELU (tanh) feed-forward of ffn_dim, the output LayerNorm in fp32;
//    with image_dim (image to video), the image embedder's LayerNorms (fp32) and GELU.
//  - diffusers CogVideoXTransformer3DModel: the same inner dim; AdaLN over an affine LayerNorm
//    (its weight in the kernel, its bias folded into the shift), per sample, of the video and the
//    text tokens, the blocks' seams (gated_adaln, the gated residual in place), the q/k
//    LayerNorms of the head dim and the final LayerNorm, a GELU (tanh) feed-forward of 4x the
//    inner dim; with use_rotary_positional_embeddings (5b, 1.5), the video tokens' q and k
//    rotated in place from the pipeline's fp32 tables (interleaved).
//  - diffusers Flux2Transformer2DModel (FLUX.2): the same inner dim; AdaLN over a LayerNorm with
//    no affine from the shared modulation, the blocks' seams (gated_adaln, gated residuals), the
//    per-head q/k RMSNorms and RoPE from diffusers' fp32 table (interleaved) as one
//    head_norm_rope (else the norms and kiln.rope), the feed-forwards' SwiGLU of mlp_ratio x the
//    inner dim.
//  - diffusers QwenImageTransformer2DModel (Qwen-Image, Qwen-Image-Edit): the same inner dim;
//    AdaLN over a LayerNorm with no affine, per sample (and per token with zero_cond_t), the
//    blocks' seams (gated_adaln, the gated residual in place), the per-head q/k RMSNorms and
//    RoPE from complex frequencies (fp32 half tables, interleaved) as one head_norm_rope a
//    stream (else the norms and kiln.rope), the text input's RMSNorm at joint_attention_dim, a
//    GELU (tanh) feed-forward of 4x the inner dim.
//  - diffusers SD3Transformer2DModel (Stable Diffusion 3, 3.5): the same inner dim; AdaLN over a
//    LayerNorm with no affine, FLUX's double-block seams (gated_adaln, gated residuals), a GELU
//    (tanh) feed-forward of 4x the inner dim, SD3.5's per-head q/k RMSNorms; no RoPE.
//  - diffusers MochiTransformer3DModel: the same inner dim and a text stream of
//    pooled_projection_dim; each stream's AdaLN over an RMSNorm with no weight (per sample), the
//    gated norms of its sublayers' outputs (fp32 table rows), the residual add with the next
//    norm (gated_adaln), the feed-forwards' SwiGLU of (4 x width x 2) / 3; the per-head q/k
//    RMSNorms and the rotation by per-head tables (fp32, read as one half table a token: q and
//    k one head each, the whole row); the output AdaLN over a LayerNorm.
//  - diffusers FluxTransformer2DModel: the same inner dim; LayerNorm and AdaLN-Zero over it,
//    RMSNorm q/k norm per head (attention_head_dim) and RoPE from a table over axes_dims_rope
//    (3 axes), interleaved, fused as one head_norm_rope where kiln's patch can (else the norm
//    and kiln.rope), a GELU (tanh) feed-forward of 4x the inner dim, gated residuals.
//  - diffusers SkyReelsV2Transformer3DModel and WanVACETransformer3DModel: as Wan's (SkyReels-V2's
//    blocks are Wan's, the self-attention masked, diffusion forcing modulating each token; Wan
//    VACE's control blocks are Wan's over the control stream).
//  - diffusers ChromaTransformer2DModel: FLUX's blocks with the modulation projections pruned (the
//    same kernels), and the modulation approximator's RMSNorms at approximator_hidden_dim.
//  - diffusers QwenImage21Transformer2DModel: one stream; AdaLN over a LayerNorm with no affine,
//    scale only, its seams, per token with causal_condition (else per sample); SwiGLU
//    feed-forwards of mlp_ratio x the inner dim; the q/k RMSNorms and rotation as Qwen-Image's;
//    the text input's RMSNorm at context_in_dim.
//  - diffusers BriaTransformer2DModel, BriaFiboTransformer2DModel, LongCatImageTransformer2DModel:
//    FLUX's blocks and attention under other names (the same kernels); OvisImageTransformer2DModel
//    too, its MLPs SwiGLUs of 4x the inner dim and its text input's RMSNorm at
//    joint_attention_dim.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "jit/prewarm.h"
#include "templates/family.h"
#include "templates/types.h"

namespace kiln::jit {

struct ModelShape {
  std::string kind;  // "llama", "mistral", "qwen2", ..., "ltx-video", "flux", "wan", "qwen-image"
  std::int64_t hidden = 0;
  std::int64_t intermediate = 0;
  std::int64_t head_dim = 0;
  std::string rope;  // how the model applies RoPE, for the summary
  // Its attention head counts (which kernel its RoPE calls take); fours when not given.
  std::int64_t heads_q = 4;
  std::int64_t heads_k = 4;
  // Its attentions normalise each head and rotate q and k in one head_norm_rope with these
  // RoPE layout flags (FLUX, Qwen3, Gemma 3).
  std::optional<std::uint32_t> head_norm_layout = std::nullopt;
  // The columns of each head its RoPE rotates: 0 for all, fewer for a partial rotation
  // (partial_rotary_factor, GPT-NeoX's rotary_pct), which RoPE's kernels specialise on.
  std::int64_t rotary_dim = 0;
  // RoPE's flags for the table forms its attentions hand kiln.rope (PrewarmModel::rope_tables).
  std::vector<std::uint32_t> rope_tables = {0u};
  // rms_norm_gated's flags where its gated norm is Mamba-2's (PrewarmModel::gated_norm_flags).
  std::optional<std::uint32_t> gated_norm_flags = std::nullopt;
  // adaln's and gated_adaln's flags as its patched DiT blocks call them, rms_norm_rope's half
  // tables, the ops it runs in fp32 (PrewarmModel's fields of the same names).
  std::optional<std::vector<std::uint32_t>> modulation_flags = std::nullopt;
  std::int64_t rms_norm_rope_half_table = 0;
  std::vector<Op> fp32_ops;
  // The ops the model uses, with the sizes each is called at.
  std::map<Op, std::vector<std::int64_t>> ops;
  // The parts of a multimodal model kiln's patch takes besides its language model (its vision
  // tower), each prewarmed with its own sizes, head counts and table forms.
  std::vector<ModelShape> towers;
};

// Throws kiln::Error naming the key that is missing or of the wrong type.
ModelShape read_model_config(const nlohmann::json& config);

// The config.json `path` names: the file itself; in a folder, its config.json (a transformers
// checkpoint, a diffusers model) or, in a diffusers pipeline's folder (model_index.json and no
// config.json), its transformer's (transformer/config.json). Throws kiln::Error, its message
// starting with `who`, where that file cannot be read or is not JSON.
nlohmann::json read_config_file(const std::filesystem::path& path, const std::string& who);

// What the families' common problems take of the model (head counts, the fused head norms'
// layout, the rotary dim), and whether it trains.
PrewarmModel prewarm_model(const ModelShape& model, bool training);

// Sizes for `ops` (all of the model's ops when empty): the model's own sizes where it uses the
// op, else the generic rule (norms and residuals: hidden size; GLU activations and GELU:
// intermediate size; RoPE: head dim).
std::map<Op, std::vector<std::int64_t>> sizes_for_ops(const ModelShape& model,
                                                      const std::vector<Op>& ops);

// What `kiln prewarm --config` compiles for the model: `ops` (all of its own when empty) at
// their sizes_for_ops, through each family's common problems for it (expand_targets).
std::vector<PrewarmTarget> model_targets(const ModelShape& model, const std::vector<Op>& ops,
                                         const std::vector<DType>& dtypes,
                                         const std::vector<int>& archs, bool training,
                                         std::vector<std::string>& notes);

}  // namespace kiln::jit
