"""Small random vision towers of transformers' multimodal models, and their inputs, for the
kiln.patch tests of vision RoPE and two-layer GELU MLPs (CPU and GPU)."""

import torch

transformers = __import__("pytest").importorskip("transformers", reason="transformers is not installed")
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl  # noqa: E402
from transformers.models.qwen3_vl import modeling_qwen3_vl  # noqa: E402

# One image of 4 x 8 patches (a 2 x 4 grid after the 2 x 2 merge), the other of 4 x 4: the
# towers attend within each image (and Qwen2.5-VL within windows).
GRID_THW = [[1, 4, 8], [1, 4, 4]]


def qwen2_5_vl(hidden=64, heads=2, layers=2):
    """Qwen2.5-VL's tower: RMSNorms, SwiGLU MLPs, window attention with the vision RoPE (head
    dim ``hidden // heads``)."""
    config = transformers.Qwen2_5_VLConfig(vision_config=dict(
        depth=layers, hidden_size=hidden, intermediate_size=2 * hidden, num_heads=heads, out_hidden_size=64,
        patch_size=14, spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[layers - 1],
        window_size=56)).vision_config
    return modeling_qwen2_5_vl.Qwen2_5_VisionTransformerPretrainedModel(config)


def qwen3_vl(hidden=64, heads=2, layers=2):
    """Qwen3-VL's tower: LayerNorms, tanh-GELU MLPs (linear_fc1/linear_fc2), the vision RoPE."""
    config = transformers.Qwen3VLConfig(vision_config=dict(
        depth=layers, hidden_size=hidden, intermediate_size=2 * hidden, num_heads=heads, out_hidden_size=64,
        patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
        deepstack_visual_indexes=[layers - 1])).vision_config
    return modeling_qwen3_vl.Qwen3VLVisionModel(config)


def pixels(tower, seed=0, grid_thw=GRID_THW):
    """(pixel_values [patches, C * T * P * P], grid_thw) for ``tower``."""
    config = tower.config
    width = config.in_channels * config.temporal_patch_size * config.patch_size ** 2
    patches = sum(t * h * w for t, h, w in grid_thw)
    values = torch.randn(patches, width, generator=torch.Generator().manual_seed(seed))
    return values, torch.tensor(grid_thw)


def embeddings(tower, values, grid_thw):
    """The tower's merged patch embeddings (what the language model reads), without grad."""
    with torch.no_grad():
        return tower(values.to(next(tower.parameters()).dtype), grid_thw=grid_thw).pooler_output


def seeded(build, dtype=torch.float32, seed=0, **sizes):
    """``build(**sizes)`` with seeded weights (norm weights made random, so they matter) in
    ``dtype``, in eval mode."""
    torch.manual_seed(seed)
    tower = build(**sizes).eval()
    with torch.no_grad():
        for name, p in tower.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return tower.to(dtype)


def minimax_m3_vl(hidden=160, heads=2, layers=2):
    """MiniMax-M3-VL's tower: its 3-D RoPE rotates the first 78 of each head's 80 columns (26 per
    axis), in the tower's dtype; LayerNorms, GELU MLPs (fc1/fc2). None
    where this transformers has no MiniMax-M3-VL."""
    try:
        from transformers.models.minimax_m3_vl import configuration_minimax_m3_vl, modeling_minimax_m3_vl
    except ImportError:
        return None
    config = configuration_minimax_m3_vl.MiniMaxM3VLVisionConfig(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=heads)
    config._attn_implementation = "sdpa"
    return modeling_minimax_m3_vl.MiniMaxM3VLVisionModel(config)


def inkling2(hidden=64, heads=2, layers=2):
    """Inkling 2's tower: its RoPE rotates interleaved pairs (``rotate_pairwise``); LayerNorms,
    GELU MLPs. None where this transformers has no Inkling 2."""
    try:
        from transformers.models.inkling2 import configuration_inkling2, modeling_inkling2
    except ImportError:
        return None
    config = configuration_inkling2.Inkling2VisionConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, projection_hidden_dim=64,
        text_hidden_size=64, posemb_grid_size=4)
    config._attn_implementation = "sdpa"
    return modeling_inkling2.Inkling2VisionModel(config)


def inkling2_model_config():
    """A tiny Inkling 2 (its configuration module's Inkling2Config): a language model of one
    attention-residual block (6 layers), value heads of 16 and, in its sliding layers, 24, four
    experts; a tower of 2 heads of 32. None where this transformers has no Inkling 2."""
    try:
        from transformers.models.inkling2 import configuration_inkling2
    except ImportError:
        return None
    return configuration_inkling2.Inkling2Config(
        text_config=dict(hidden_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=24,
                         moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, vocab_size=256,
                         unpadded_vocab_size=256, d_rel=8, eos_token_id=2),
        vision_config=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, projection_hidden_dim=64,
                           text_hidden_size=64, posemb_grid_size=4))


def other_tower_inputs(tower, seed=0):
    """The keyword arguments of one forward of a MiniMax-M3-VL (an 8 x 8 patch grid) or Inkling 2
    tower (one image of 3 x 4 merged tokens, each 2 x 2 patches of 20 x 20 pixels)."""
    g = torch.Generator().manual_seed(seed)
    dtype = next(tower.parameters()).dtype
    config = tower.config
    if config.model_type == "inkling2_vision":
        side = config.patch_size * config.spatial_merge_size
        values = torch.rand(12, side, side, config.num_channels, generator=g) * 2 - 1
        return {"pixel_values": values.to(dtype), "image_grid_thw": torch.tensor([[1, 3, 4]])}
    width = config.num_channels * config.temporal_patch_size * config.patch_size ** 2
    return {"pixel_values": torch.randn(64, width, generator=g).to(dtype), "grid_thw": torch.tensor([[1, 8, 8]])}
