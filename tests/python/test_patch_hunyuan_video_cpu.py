"""kiln.patch on HunyuanVideo's transformers (diffusers' HunyuanVideoTransformer3DModel and
HunyuanVideo15Transformer3DModel; HunyuanImageTransformer2DModel, built of HunyuanVideo's blocks),
on the CPU: their attentions' video-token q/k norms and rotation as kiln.head_norm_rope_, their
double blocks' seams as kiln.gated_adaln and kiln.gated_residual_, the single blocks' as kiln.gelu
into proj_out's input and kiln.gated_residual, against diffusers' own forward (fp32 and bf16),
with a padded prompt, under autograd and under torch.compile."""

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
pytest.importorskip("diffusers.models.transformers.transformer_hunyuan_video15",
                    reason="this diffusers has no HunyuanVideo 1.5 transformer")

from graph_model import calls_of  # noqa: E402
from test_patch_dit_cpu import (Counter, _agree, _compiled_patched_graphs, _instance_forwards,  # noqa: E402
                                _norms_spread, _trains_as_diffusers)

ATTENTION = "hunyuan-video attention (per-head q/k rms_norm + rope of the video tokens)"
DOUBLE = "hunyuan-video double block (gated residual + norm seams)"
SINGLE = "hunyuan-video single block (gelu into proj_out's input, gated residual)"
# The token refiner's feed-forward (a linear map then SiLU, diffusers' "linear-silu") is no op of kiln's.
REFINER_FF = "context_embedder.token_refiner.refiner_blocks.0.ff.net.0"

_SIZES = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=2,
              num_refiner_layers=1, text_embed_dim=16, rope_axes_dim=(4, 6, 6))


def _hunyuan_video(dtype, device="cpu", **config):
    """A tiny HunyuanVideo transformer (two double-stream, two single-stream blocks), its norms'
    weights spread."""
    torch.manual_seed(0)
    model = diffusers.HunyuanVideoTransformer3DModel(num_single_layers=2, patch_size=1, patch_size_t=1,
                                                     pooled_projection_dim=8, **_SIZES, **config).eval()
    return _norms_spread(model).to(device=device, dtype=dtype)


def _hunyuan_video_inputs(dtype, device="cpu", prompt=(7, 4)):
    """Two 3-frame 4 x 4 latents and prompts of 7 tokens, `prompt` of them valid (a padding mask)."""
    g = torch.Generator().manual_seed(3)
    return dict(hidden_states=torch.randn(2, 4, 3, 4, 4, generator=g).to(device, dtype),
                timestep=torch.tensor([300, 700], device=device),
                encoder_hidden_states=torch.randn(2, 7, 16, generator=g).to(device, dtype),
                encoder_attention_mask=(torch.arange(7)[None] < torch.tensor(prompt)[:, None]).long().to(device),
                pooled_projections=torch.randn(2, 8, generator=g).to(device, dtype),
                guidance=torch.tensor([3000.0, 3000.0]).to(device, dtype), return_dict=False)


def _hunyuan_video_15(dtype, device="cpu"):
    """A tiny HunyuanVideo 1.5 transformer (two double-stream blocks), its norms' weights spread."""
    torch.manual_seed(0)
    model = diffusers.HunyuanVideo15Transformer3DModel(text_embed_2_dim=12, image_embed_dim=10, **_SIZES).eval()
    return _norms_spread(model).to(device=device, dtype=dtype)


def _hunyuan_video_15_inputs(dtype, device="cpu"):
    """Two 3-frame 4 x 4 latents, padded prompts of both text encoders and an image's embeddings."""
    g = torch.Generator().manual_seed(3)
    return dict(hidden_states=torch.randn(2, 4, 3, 4, 4, generator=g).to(device, dtype),
                timestep=torch.tensor([300.0, 700.0]).to(device, dtype),
                encoder_hidden_states=torch.randn(2, 7, 16, generator=g).to(device, dtype),
                encoder_attention_mask=torch.tensor([[1] * 7, [1] * 4 + [0] * 3], device=device),
                encoder_hidden_states_2=torch.randn(2, 5, 12, generator=g).to(device, dtype),
                encoder_attention_mask_2=torch.tensor([[1] * 5, [1] * 2 + [0] * 3], device=device),
                image_embeds=torch.randn(2, 3, 10, generator=g).to(device, dtype), return_dict=False)


def _hunyuan_image(dtype, device="cpu"):
    """A tiny HunyuanImage 2.1 transformer (two double-stream, two single-stream blocks, a ByT5
    projection), its norms' weights spread."""
    torch.manual_seed(0)
    sizes = dict(_SIZES, rope_axes_dim=(8, 8))
    model = diffusers.HunyuanImageTransformer2DModel(num_single_layers=2, text_embed_2_dim=12, **sizes).eval()
    return _norms_spread(model).to(device=device, dtype=dtype)


def _hunyuan_image_inputs(dtype, device="cpu"):
    """Two 4 x 6 latents, padded prompts of both text encoders."""
    g = torch.Generator().manual_seed(3)
    return dict(hidden_states=torch.randn(2, 4, 4, 6, generator=g).to(device, dtype),
                timestep=torch.tensor([300.0, 700.0]).to(device, dtype),
                encoder_hidden_states=torch.randn(2, 7, 16, generator=g).to(device, dtype),
                encoder_attention_mask=torch.tensor([[1] * 7, [1] * 4 + [0] * 3], device=device),
                encoder_hidden_states_2=torch.randn(2, 5, 12, generator=g).to(device, dtype),
                encoder_attention_mask_2=torch.tensor([[1] * 5, [1] * 2 + [0] * 3], device=device), return_dict=False)


# Each double block: two adaln (norm1, norm1_context), the video tokens' q/k norms and rotation
# (head_norm_rope_), the text's q/k norms (two rms_norm), two gated_adaln, two gated_residual_, two
# gelu; each single block: one adaln, one head_norm_rope_, the text tokens' q/k norms (two rms_norm),
# one gelu into proj_out's input, one gated_residual; the output AdaLN; the refiner's two LayerNorms.
HUNYUAN_VIDEO_CALLS = {"adaln": 7, "head_norm_rope_": 4, "rms_norm": 8, "gated_adaln": 4, "gated_residual_": 4,
                       "gelu": 6, "gated_residual": 2, "layer_norm": 2}
# Two double blocks, the output AdaLN, the refiner's two LayerNorms, the ByT5 projection's one and
# the image projection's two.
HUNYUAN_VIDEO_15_CALLS = {"adaln": 5, "head_norm_rope_": 2, "rms_norm": 4, "gated_adaln": 4, "gated_residual_": 4,
                          "gelu": 4, "layer_norm": 5}


# HunyuanVideo's calls, its ByT5 projection's LayerNorm too.
HUNYUAN_IMAGE_CALLS = dict(HUNYUAN_VIDEO_CALLS, layer_norm=3)


def _patched_agrees(model, inputs, dtype, calls, monkeypatch):
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = kiln.patch(model)
        assert [entry.path for entry in report.left] == [REFINER_FF]
        counter = Counter(monkeypatch)
        actual = model(**inputs)[0]
        assert counter.used() == calls
        _agree(actual, expected, dtype)
        assert kiln.unpatch(model) == len(report.replaced)
        assert _instance_forwards(model) == []
        assert torch.equal(model(**inputs)[0], expected)
    return {r.path: r.kind for r in report.replaced}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hunyuan_video_patched_agrees_and_unpatch_restores(dtype, monkeypatch):
    kinds = _patched_agrees(_hunyuan_video(dtype), _hunyuan_video_inputs(dtype), dtype, HUNYUAN_VIDEO_CALLS,
                            monkeypatch)
    assert kinds["transformer_blocks.0"] == kinds["transformer_blocks.1"] == DOUBLE
    assert kinds["single_transformer_blocks.0"] == kinds["single_transformer_blocks.1"] == SINGLE
    assert kinds["transformer_blocks.0.attn"] == kinds["single_transformer_blocks.1.attn"] == ATTENTION


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hunyuan_video_15_patched_agrees_and_unpatch_restores(dtype, monkeypatch):
    kinds = _patched_agrees(_hunyuan_video_15(dtype), _hunyuan_video_15_inputs(dtype), dtype, HUNYUAN_VIDEO_15_CALLS,
                            monkeypatch)
    assert kinds["transformer_blocks.0"] == kinds["transformer_blocks.1"] == DOUBLE
    assert kinds["transformer_blocks.1.attn"] == ATTENTION


def test_hunyuan_video_15_makes_its_pair_mask_once_a_forward(monkeypatch):
    """HunyuanVideo 1.5's mask of valid query and key pairs, which diffusers builds in every
    block, is made once a forward (a new forward, a new mask), and is diffusers' mask."""
    from kiln.patching import hunyuan_video

    made = []
    pair_mask = hunyuan_video._pair_mask

    def counted(attention_mask, batch, seq):
        made.append(seq)
        return pair_mask(attention_mask, batch, seq)

    monkeypatch.setattr(hunyuan_video, "_pair_mask", counted)
    model = _hunyuan_video_15(torch.float32)
    inputs = _hunyuan_video_15_inputs(torch.float32)
    with torch.no_grad():
        expected = model(**inputs)[0]
        kiln.patch(model)
        made.clear()  # the probes' masks
        for forwards in (1, 2):
            _agree(model(**inputs)[0], expected, torch.float32)
            assert made == [63] * forwards  # 48 video, 7 + 5 text and 3 image tokens
    valid = torch.tensor([[1, 1, 0], [1, 0, 1]])
    rows = torch.nn.functional.pad(valid, (2, 0), value=True).bool().view(2, 1, 1, 5).repeat(1, 1, 5, 1)
    assert torch.equal(pair_mask(valid, 2, 5), rows & rows.transpose(2, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hunyuan_image_patched_agrees_and_unpatch_restores(dtype, monkeypatch):
    """HunyuanImage 2.1's blocks and attentions are HunyuanVideo's (its double block names the
    rotation image_rotary_emb, and is called with it by name)."""
    kinds = _patched_agrees(_hunyuan_image(dtype), _hunyuan_image_inputs(dtype), dtype, HUNYUAN_IMAGE_CALLS,
                            monkeypatch)
    assert kinds["transformer_blocks.0"] == kinds["transformer_blocks.1"] == DOUBLE
    assert kinds["single_transformer_blocks.0"] == kinds["single_transformer_blocks.1"] == SINGLE
    assert kinds["transformer_blocks.0.attn"] == kinds["single_transformer_blocks.1.attn"] == ATTENTION


def test_hunyuan_video_unpadded_prompt():
    model = _hunyuan_video(torch.float32)
    inputs = _hunyuan_video_inputs(torch.float32, prompt=(7, 7))
    with torch.no_grad():
        expected = model(**inputs)[0]
        kiln.patch(model)
        _agree(model(**inputs)[0], expected, torch.float32)


def test_hunyuan_video_trains_through_kiln_rope_and_diffusers_seams(monkeypatch):
    """Recording a graph, the blocks run diffusers' forward (their fused seams have no backward),
    the attentions their norm modules and one kiln.rope of the video tokens; every gradient
    agrees."""
    used = _trains_as_diffusers(_hunyuan_video(torch.float32), _hunyuan_video_inputs(torch.float32),
                                lambda: Counter(monkeypatch))
    assert used["rope"] == 4 and "head_norm_rope_" not in used and "gated_adaln" not in used


def test_hunyuan_video_under_torch_compile():
    """Compiled, the double blocks' seams and the attentions' norms and rotation stay kiln's;
    the single blocks run diffusers' forward (Inductor fuses their concatenations itself)."""
    graphs = _compiled_patched_graphs(_hunyuan_video(torch.float32), _hunyuan_video_inputs(torch.float32))
    assert len(calls_of(graphs, torch.ops.kiln.head_norm_rope_.default)) == 4
    assert len(calls_of(graphs, torch.ops.kiln.gated_adaln.default)) == 4
    assert calls_of(graphs, torch.ops.kiln.gated_residual.default) == []


def test_hunyuan_video_15_block_under_torch_compile():
    """A patched HunyuanVideo 1.5 block compiles whole (fullgraph): its pair mask traced as a
    broadcast, its seams and the video tokens' norms and rotation kiln's; it agrees with diffusers'."""
    from graph_model import compile_capturing

    model = _hunyuan_video_15(torch.float32)
    block = model.transformer_blocks[0]
    g = torch.Generator().manual_seed(5)
    angles = torch.randn(12, 8, generator=g)
    args = (torch.randn(2, 12, 32, generator=g), torch.randn(2, 6, 32, generator=g), torch.randn(2, 32, generator=g),
            torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]),
            (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)))
    with torch.no_grad():
        expected = block(*args)
        kiln.patch(model)
        compiled, graphs = compile_capturing(block)
        actual = compiled(*args)
    torch._dynamo.reset()
    for a, e in zip(actual, expected):
        _agree(a, e, torch.float32)
    assert len(calls_of(graphs, torch.ops.kiln.head_norm_rope_.default)) == 1
    assert len(calls_of(graphs, torch.ops.kiln.gated_adaln.default)) == 2


def test_hunyuan_video_token_replace_blocks_are_left():
    """The image-to-video model's token-replace blocks (the first frame modulated apart) keep
    diffusers' forward; their attentions are kiln's, and the model agrees."""
    model = _hunyuan_video(torch.float32, image_condition_type="token_replace")
    inputs = _hunyuan_video_inputs(torch.float32)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = kiln.patch(model)
        left = {entry.path: entry.reason for entry in report.left}
        kinds = {r.path: r.kind for r in report.replaced}
        assert "block arguments" in left["transformer_blocks.0"] and "block arguments" in left[
            "single_transformer_blocks.0"]
        assert kinds["transformer_blocks.0.attn"] == kinds["single_transformer_blocks.0.attn"] == ATTENTION
        _agree(model(**inputs)[0], expected, torch.float32)


def test_hunyuan_video_framepack_blocks_are_patched():
    """FramePack's transformer is built of HunyuanVideo's blocks: they are patched alike."""
    torch.manual_seed(0)
    model = diffusers.HunyuanVideoFramepackTransformer3DModel(num_single_layers=1, patch_size=1, patch_size_t=1,
                                                              pooled_projection_dim=8, image_proj_dim=12,
                                                              **dict(_SIZES, num_layers=1))
    kinds = {r.path: r.kind for r in kiln.patch(model).replaced}
    assert kinds["transformer_blocks.0"] == DOUBLE and kinds["single_transformer_blocks.0"] == SINGLE
    assert kinds["transformer_blocks.0.attn"] == kinds["single_transformer_blocks.0.attn"] == ATTENTION
