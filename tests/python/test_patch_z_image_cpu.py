"""kiln.patch on Z-Image's transformer (diffusers' ZImageTransformer2DModel), on the CPU: its
attention's per-head q/k norms and complex rotation as kiln.head_norm_rope, its feed-forward's
gating as kiln.swiglu, its modulated blocks' seams as kiln.adaln, kiln.gated_adaln and
kiln.gated_residual_, against diffusers' own forward (fp32 and bf16), with captions of two
lengths (a padding mask), under autograd and under torch.compile."""

import functools

import pytest
import torch

import kiln
from kiln import activation_ops

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
pytest.importorskip("diffusers.models.transformers.transformer_z_image", reason="this diffusers has no Z-Image transformer")

from graph_model import calls_of  # noqa: E402
from test_patch_dit_cpu import (Counter, _agree, _compiled_patched_graphs, _instance_forwards,  # noqa: E402
                                _norms_spread, _trains_as_diffusers)

ATTENTION = "z-image attention (per-head q/k rms_norm + rope)"
BLOCK = "z-image block (adaln, gated residual + norm seams)"
FEED_FORWARD = "mlp swiglu (w1, w3, w2)"
Calls = functools.partial(Counter, more=((activation_ops, "swiglu"),))


def _z_image(dtype, device="cpu"):
    """A tiny Z-Image transformer (a noise and a caption refiner block, two main blocks), its norms'
    weights spread."""
    torch.manual_seed(0)
    model = diffusers.ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32, n_layers=2, n_refiner_layers=1, n_heads=2,
        n_kv_heads=2, cap_feat_dim=16, axes_dims=[4, 6, 6], axes_lens=[64, 16, 16]).eval()
    return _norms_spread(model).to(device=device, dtype=dtype)


def _z_image_inputs(dtype, device="cpu", caption_lengths=(7, 5)):
    """Two 8 x 8 latents and their captions (of different lengths: the batch is padded, masked)."""
    g = torch.Generator().manual_seed(3)
    return dict(x=[torch.randn(4, 1, 8, 8, generator=g).to(device, dtype) for _ in caption_lengths],
                t=torch.tensor([0.3, 0.7]).to(device, dtype),
                cap_feats=[torch.randn(n, 16, generator=g).to(device, dtype) for n in caption_lengths],
                return_dict=False)


def _first(outputs):
    return torch.stack(outputs[0])


# Each modulated block (the noise refiner's and the two main ones): one adaln, one gated_adaln, one
# gated_residual_, its sublayers' output norms (two rms_norm); every attention's norms and rotation
# (head_norm_rope) and feed-forward's gating (swiglu), the caption refiner's included, whose four
# norms are rms_norm; the caption embedder's RMSNorm and the final LayerNorm.
Z_IMAGE_CALLS = {"adaln": 3, "gated_adaln": 3, "gated_residual_": 3, "rms_norm": 11, "head_norm_rope": 4,
                 "swiglu": 4, "layer_norm": 1}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_z_image_patched_agrees_and_unpatch_restores(dtype, monkeypatch):
    model = _z_image(dtype)
    inputs = _z_image_inputs(dtype)
    with torch.no_grad():
        expected = _first(model(**inputs))
        report = kiln.patch(model)
        kinds = {r.path: r.kind for r in report.replaced}
        assert report.left == []
        assert kinds["noise_refiner.0"] == kinds["layers.0"] == kinds["layers.1"] == BLOCK
        assert "context_refiner.0" not in kinds  # no modulation: its children are patched
        assert kinds["layers.0.attention"] == kinds["context_refiner.0.attention"] == ATTENTION
        assert kinds["layers.1.feed_forward"] == kinds["context_refiner.0.feed_forward"] == FEED_FORWARD
        counter = Calls(monkeypatch)
        actual = _first(model(**inputs))
        assert counter.used() == Z_IMAGE_CALLS
        _agree(actual, expected, dtype)
        assert kiln.unpatch(model) == len(report.replaced)
        assert _instance_forwards(model) == []
        assert torch.equal(_first(model(**inputs)), expected)


def test_z_image_captions_of_one_length():
    """No padding (and no mask) where the captions are of one length."""
    model = _z_image(torch.float32)
    inputs = _z_image_inputs(torch.float32, caption_lengths=(6, 6))
    with torch.no_grad():
        expected = _first(model(**inputs))
        kiln.patch(model)
        _agree(_first(model(**inputs)), expected, torch.float32)


def test_z_image_trains_through_kiln_rope_swiglu_and_diffusers_seams(monkeypatch):
    """Recording a graph, the blocks run diffusers' forward (their fused seams have no backward),
    the attentions their norm modules and one kiln.rope, the feed-forwards kiln.swiglu; every
    gradient agrees."""
    model, inputs = _z_image(torch.float32), _z_image_inputs(torch.float32)
    forward = model.forward
    model.forward = lambda **kw: (_first(forward(**kw)),)
    used = _trains_as_diffusers(model, inputs, lambda: Calls(monkeypatch))
    assert used["rope"] == 4 and used["swiglu"] == 4 and "head_norm_rope" not in used and "gated_adaln" not in used


def test_z_image_block_is_left_to_inductor_under_torch_compile():
    """Compiled, a patched block runs diffusers' seams (Inductor fuses them with their
    neighbours); its attention still normalises and rotates in kiln's launch."""
    model = _z_image(torch.float32)
    forward = model.forward
    model.forward = lambda **kw: (_first(forward(**kw)),)
    graphs = _compiled_patched_graphs(model, _z_image_inputs(torch.float32))
    assert calls_of(graphs, torch.ops.kiln.gated_adaln.default) == []
    assert len(calls_of(graphs, torch.ops.kiln.head_norm_rope.default)) == 4


def test_z_image_feed_forward_with_another_gating_is_left():
    """A feed-forward whose gating is not SiLU's keeps diffusers' forward."""
    model = _z_image(torch.float32)
    ff = model.layers[0].feed_forward
    ff._forward_silu_gating = lambda x1, x3: torch.nn.functional.gelu(x1) * x3
    report = kiln.patch(model)
    left = {entry.path: entry.reason for entry in report.left}
    assert "w2(silu(w1(x)) * w3(x))" in left["layers.0.feed_forward"]
    assert {r.path: r.kind for r in report.replaced}["layers.1.feed_forward"] == FEED_FORWARD
