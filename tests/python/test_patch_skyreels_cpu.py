"""kiln.patch on SkyReels-V2's transformer (diffusers' SkyReelsV2Transformer3DModel), on the CPU:
Wan's blocks with a masked self-attention, so Wan's seams (kiln.adaln, kiln.gated_adaln, the next
block's norm handed over) and Wan's attention processor (kiln.rms_norm_rope), against diffusers'
own forward: text to video (per-sample modulation), and diffusion forcing (each frame its own
timestep: per-token modulation rows [B, 6, S, D]; frame blocks under a causal mask), fp32 and
bf16, under autograd and under torch.compile."""

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
from diffusers.models.transformers.transformer_skyreels_v2 import SkyReelsV2AttnProcessor  # noqa: E402

from graph_model import calls_of  # noqa: E402
from test_patch_dit_cpu import (Counter, _agree, _compiled_patched_graphs, _instance_forwards,  # noqa: E402
                                _processors, _trains_as_diffusers)
from test_patch_wan_cpu import _wan  # noqa: E402

LAYERS = 3
BLOCK = "skyreels-v2 block (adaln, gated residual + norm seams)"


def _skyreels(dtype, device="cpu", **config):
    """A tiny SkyReels-V2 transformer in `dtype`, what diffusers' loader keeps in fp32 in fp32."""
    return _wan(dtype, device, "SkyReelsV2Transformer3DModel", num_layers=LAYERS, **config)


def _skyreels_inputs(dtype, device="cpu", forcing=False):
    """Two latents of 4 frames of 4 x 6 (6 tokens a frame after 2 x 2 patches); with ``forcing``, a
    timestep a frame (diffusion forcing: later frames noisier)."""
    g = torch.Generator().manual_seed(3)
    timestep = torch.tensor([[0, 200, 600, 900], [100, 300, 500, 999]]) if forcing else torch.tensor([500, 300])
    return dict(hidden_states=torch.randn(2, 4, 4, 4, 6, generator=g).to(device, dtype), timestep=timestep.to(device),
                encoder_hidden_states=torch.randn(2, 7, 16, generator=g).to(device, dtype),
                enable_diffusion_forcing=forcing, return_dict=False)


# Per forward: block 0's norm1 AdaLN; two gated_adaln a block and each block's last residual with
# the next block's norm1 (handed over); the last block's last residual as diffusers writes it; each
# self-attention's q/k norms and rotation; the cross-attentions' q/k RMSNorms; the feed-forwards'
# GELU; the output norm.
CALLS = {"adaln": 1, "gated_adaln": 3 * LAYERS - 1, "rms_norm_rope": LAYERS, "rms_norm": 2 * LAYERS, "gelu": LAYERS,
         "layer_norm": 1}
# Text to video; diffusion forcing, frames one at a time (no mask) and in blocks of two (causal).
CASES = {"t2v": ({}, False), "forcing": ({}, True), "forcing-causal": (dict(num_frame_per_block=2), True)}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_skyreels_patched_agrees_and_unpatch_restores(dtype, case, monkeypatch):
    config, forcing = CASES[case]
    model, inputs = _skyreels(dtype, **config), _skyreels_inputs(dtype, forcing=forcing)
    processors = _processors(model)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = kiln.patch(model)
        kinds = {r.path: r.kind for r in report.replaced}
        assert [kinds[f"blocks.{i}"] for i in range(LAYERS)] == [BLOCK] * LAYERS
        assert kinds["blocks.0.attn1"] == "wan attention (q/k rms_norm + rope)"
        assert report.left == []
        counter = Counter(monkeypatch)
        actual = model(**inputs)[0]
        assert counter.used() == CALLS
        _agree(actual, expected, dtype)
        assert kiln.unpatch(model) == len(report.replaced)
        assert _processors(model) == processors and _instance_forwards(model) == []
        assert all(type(p) is SkyReelsV2AttnProcessor for p in processors.values())
        assert torch.equal(model(**inputs)[0], expected)


def test_skyreels_causal_mask_reaches_the_self_attention():
    """Frames in causal blocks see only earlier blocks: the first frame's output does not change
    with the last frame's latents, as it does without the mask."""
    outputs = {}
    for blocks in (1, 2):
        model = _skyreels(torch.float32, num_frame_per_block=blocks)
        kiln.patch(model)
        inputs = _skyreels_inputs(torch.float32, forcing=True)
        with torch.no_grad():
            before = model(**inputs)[0]
            inputs["hidden_states"][:, :, -1] += 1
            outputs[blocks] = (before, model(**inputs)[0])
    causal_before, causal_after = outputs[2]
    assert torch.equal(causal_before[:, :, 0], causal_after[:, :, 0])
    plain_before, plain_after = outputs[1]
    assert not torch.allclose(plain_before[:, :, 0], plain_after[:, :, 0], atol=1e-4)


def test_skyreels_trains_as_diffusers(monkeypatch):
    """Recording a graph, the blocks run diffusers' forward; every gradient agrees."""
    used = _trains_as_diffusers(_skyreels(torch.float32, num_frame_per_block=2),
                                _skyreels_inputs(torch.float32, forcing=True), lambda: Counter(monkeypatch))
    assert "gated_adaln" not in used and "rope" in used


def test_skyreels_under_torch_compile():
    """Compiled, the blocks' seams stay kiln's (each compiled region computes its own norm1)."""
    graphs = _compiled_patched_graphs(_skyreels(torch.float32, num_frame_per_block=2),
                                      _skyreels_inputs(torch.float32, forcing=True))
    assert len(calls_of(graphs, torch.ops.kiln.gated_adaln.default)) == 2 * LAYERS
    assert len(calls_of(graphs, torch.ops.kiln.adaln.default)) == LAYERS
