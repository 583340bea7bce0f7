"""kiln.patch on Qwen-Image's transformer (diffusers' QwenImageTransformer2DModel), on the CPU:
its attention's per-head q/k norms and complex rotation as kiln.head_norm_rope_ a stream, its
blocks' seams as kiln.adaln, kiln.gated_adaln and kiln.gated_residual_, against diffusers'
own forward (fp32 and bf16), with a text mask, Qwen-Image-Edit's per-token modulation, under
autograd and under torch.compile."""

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
pytest.importorskip("diffusers.models.transformers.transformer_qwenimage",
                    reason="this diffusers has no Qwen-Image transformer")

from graph_model import calls_of  # noqa: E402
from test_patch_dit_cpu import (Counter, _agree, _compiled_patched_graphs, _instance_forwards,  # noqa: E402
                                _norms_spread, _trains_as_diffusers)

ATTENTION = "qwen-image attention (per-head q/k rms_norm + rope)"
BLOCK = "qwen-image block (adaln, gated residual + norm seams)"


def _qwen_image(dtype, device="cpu", zero_cond_t=False):
    """A tiny Qwen-Image transformer (Qwen-Image-Edit-2511's per-token modulation with
    ``zero_cond_t``), its norms' weights spread."""
    torch.manual_seed(0)
    model = diffusers.QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=32, axes_dims_rope=(4, 6, 6), zero_cond_t=zero_cond_t).eval()
    return _norms_spread(model).to(device=device, dtype=dtype)


def _qwen_image_inputs(dtype, device="cpu", images=1, masked=True):
    """Two samples of a 4 x 6 latent grid (``images`` of them: an edit's target then its
    condition) and 7 text tokens, the second sample's last two masked out."""
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    return dict(hidden_states=torch.randn(2, 24 * images, 16, generator=g).to(device, dtype),
                encoder_hidden_states=torch.randn(2, 7, 32, generator=g).to(device, dtype),
                encoder_hidden_states_mask=mask.to(device) if masked else None,
                timestep=torch.tensor([0.3, 0.8]).to(device, dtype), img_shapes=[[(1, 4, 6)] * images] * 2,
                return_dict=False)


# A block each: one adaln a stream (norm1), one gated_adaln a stream (the attention's gated
# residual and norm2), one gated_residual_ a stream (the feed-forward's), one head_norm_rope_
# a stream (text, image: in place on the joint concatenation); the output AdaLayerNormContinuous
# (adaln), the text input's RMSNorm and the feed-forwards' GELUs.
QWEN_IMAGE_CALLS = {"adaln": 5, "gated_adaln": 4, "gated_residual_": 4, "head_norm_rope_": 4, "rms_norm": 1,
                    "gelu": 4}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qwen_image_patched_agrees_and_unpatch_restores(dtype, monkeypatch):
    model = _qwen_image(dtype)
    inputs = _qwen_image_inputs(dtype)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = kiln.patch(model)
        kinds = {r.path: r.kind for r in report.replaced}
        assert kinds["transformer_blocks.0"] == kinds["transformer_blocks.1"] == BLOCK
        assert kinds["transformer_blocks.0.attn"] == kinds["transformer_blocks.1.attn"] == ATTENTION
        assert report.left == []
        counter = Counter(monkeypatch)
        actual = model(**inputs)[0]
        assert counter.used() == QWEN_IMAGE_CALLS
        _agree(actual, expected, dtype)
        assert kiln.unpatch(model) == len(report.replaced)
        assert _instance_forwards(model) == []
        assert torch.equal(model(**inputs)[0], expected)


def test_qwen_image_edit_per_token_modulation(monkeypatch):
    """Qwen-Image-Edit-2511 (``zero_cond_t``): the target's tokens take the timestep's
    modulation, the condition image's the zero timestep's; kiln reads them per token."""
    model = _qwen_image(torch.float32, zero_cond_t=True)
    inputs = _qwen_image_inputs(torch.float32, images=2)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = kiln.patch(model)
        assert {r.path: r.kind for r in report.replaced}["transformer_blocks.0"] == BLOCK
        counter = Counter(monkeypatch)
        actual = model(**inputs)[0]
        assert counter.used() == QWEN_IMAGE_CALLS
        _agree(actual, expected, torch.float32)


def test_qwen_image_without_a_text_mask():
    model = _qwen_image(torch.float32)
    inputs = _qwen_image_inputs(torch.float32, masked=False)
    with torch.no_grad():
        expected = model(**inputs)[0]
        kiln.patch(model)
        _agree(model(**inputs)[0], expected, torch.float32)


def test_qwen_image_trains_through_kiln_rope_and_diffusers_seams(monkeypatch):
    """Recording a graph, the blocks run diffusers' forward (their fused seams have no backward)
    and the attention its norm modules and one kiln.rope a stream; every gradient agrees."""
    used = _trains_as_diffusers(_qwen_image(torch.float32), _qwen_image_inputs(torch.float32),
                                lambda: Counter(monkeypatch))
    assert used["rope"] == 4 and "head_norm_rope_" not in used and "gated_adaln" not in used


def test_qwen_image_block_seams_are_kiln_under_torch_compile():
    """Compiled, a patched block's seams are kiln's in the graph where its modulation is per
    sample, and diffusers' (Inductor reads the selection in the kernels it fuses) where it is per
    token; the attention normalises and rotates in kiln's launches either way."""
    graphs = _compiled_patched_graphs(_qwen_image(torch.float32), _qwen_image_inputs(torch.float32))
    seams = {op: len(calls_of(graphs, getattr(torch.ops.kiln, op).default))
             for op in ("adaln", "gated_adaln", "gated_residual_", "head_norm_rope_")}
    # A stream each in each block; one adaln more: the output norm.
    assert seams == {"adaln": 5, "gated_adaln": 4, "gated_residual_": 4, "head_norm_rope_": 4}
    graphs = _compiled_patched_graphs(_qwen_image(torch.float32, zero_cond_t=True),
                                      _qwen_image_inputs(torch.float32, images=2))
    assert calls_of(graphs, torch.ops.kiln.gated_adaln.default) == []
    assert len(calls_of(graphs, torch.ops.kiln.head_norm_rope_.default)) == 4


def test_qwen_image_attention_with_another_rotation_is_left():
    """A processor whose rotation is not Qwen's complex one keeps diffusers' processor."""
    from diffusers.models.transformers import transformer_qwenimage as qi

    model = _qwen_image(torch.float32)
    block = model.transformer_blocks[0]

    class Swapped(type(block.attn.processor)):
        def __call__(self, attn, hidden_states, encoder_hidden_states=None, encoder_hidden_states_mask=None,
                     attention_mask=None, image_rotary_emb=None):
            if image_rotary_emb is not None:
                image_rotary_emb = tuple(f.conj() for f in image_rotary_emb)
            return super().__call__(attn, hidden_states, encoder_hidden_states, encoder_hidden_states_mask,
                                    attention_mask, image_rotary_emb)

    Swapped.__call__.__qualname__ = qi.QwenDoubleStreamAttnProcessor2_0.__call__.__qualname__
    Swapped.__module__ = qi.__name__
    block.attn.set_processor(Swapped())
    report = kiln.patch(model)
    left = {entry.path: entry.reason for entry in report.left}
    assert "Qwen-Image's attention" in left["transformer_blocks.0.attn"]
    assert {r.path: r.kind for r in report.replaced}["transformer_blocks.1.attn"] == ATTENTION
