"""kiln.patch on FLUX.2's transformer (diffusers' Flux2Transformer2DModel), on the CPU: its
double blocks' seams as kiln.adaln, kiln.gated_adaln and kiln.gated_residual_, its single
blocks' as kiln.adaln and kiln.gated_residual, its attentions' per-head q/k norms and rotation
as kiln.head_norm_rope(_) and the single blocks' SwiGLU written into to_out's input, against
diffusers' own forward (fp32 and bf16), under autograd and under torch.compile."""

import pytest
import torch

import kiln
from kiln import activation_ops

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
if not hasattr(diffusers, "Flux2Transformer2DModel"):
    pytest.skip("this diffusers has no FLUX.2 transformer", allow_module_level=True)

from graph_model import calls_of  # noqa: E402
from test_patch_dit_cpu import (Counter, _agree, _compiled_patched_graphs, _instance_forwards,  # noqa: E402
                                _trains_as_diffusers)


def _flux2(dtype, device="cpu"):
    torch.manual_seed(0)
    model = diffusers.Flux2Transformer2DModel(
        patch_size=1, in_channels=8, num_layers=1, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=24, axes_dims_rope=(4, 4, 4, 4), timestep_guidance_channels=16).eval()
    with torch.no_grad():  # the q/k norms' weights start at 1
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model.to(device=device, dtype=dtype)


def _flux2_inputs(dtype, device="cpu"):
    g = torch.Generator().manual_seed(3)
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.zeros(1), torch.arange(3.0), torch.arange(4.0),
                                     indexing="ij"), -1).reshape(12, 4)
    text_ids = torch.stack([torch.zeros(5), torch.zeros(5), torch.zeros(5), torch.arange(5.0)], -1)
    return dict(hidden_states=torch.randn(2, 12, 8, generator=g).to(device, dtype),
                encoder_hidden_states=torch.randn(2, 5, 24, generator=g).to(device, dtype),
                timestep=torch.tensor([0.3, 0.7]).to(device, dtype),
                guidance=torch.tensor([3.5, 3.5]).to(device, dtype),
                img_ids=ids.to(device), txt_ids=text_ids.to(device), return_dict=False)


class _Calls(Counter):
    """Counter's kiln calls and kiln.swiglu's."""

    def __init__(self, monkeypatch):
        super().__init__(monkeypatch, more=((activation_ops, "swiglu"),))


# The double block: an adaln, a gated_adaln and a gated_residual_ a stream, the joint attention's
# norms and rotation in place a stream (head_norm_rope_), each feed-forward's SwiGLU; each single
# block: one adaln, one gated_residual, its attention's norms and rotation (head_norm_rope) and
# its MLP's SwiGLU into to_out's input; the output AdaLayerNormContinuous.
FLUX2_CALLS = {"adaln": 5, "gated_adaln": 2, "gated_residual_": 2, "gated_residual": 2, "head_norm_rope_": 2,
               "head_norm_rope": 2, "swiglu": 4}
DOUBLE = "flux.2 double block (adaln, gated residual + norm seams)"
SINGLE = "flux.2 single block (adaln, gated residual)"
PARALLEL = "flux.2 parallel attention (per-head q/k rms_norm + rope, swiglu into to_out's input)"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flux2_patched_agrees_and_unpatch_restores(dtype, monkeypatch):
    model = _flux2(dtype)
    inputs = _flux2_inputs(dtype)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = kiln.patch(model)
        kinds = {r.path: r.kind for r in report.replaced}
        assert kinds["transformer_blocks.0"] == DOUBLE
        assert kinds["single_transformer_blocks.0"] == kinds["single_transformer_blocks.1"] == SINGLE
        assert kinds["single_transformer_blocks.1.attn"] == PARALLEL
        assert kinds["transformer_blocks.0.attn"] == "flux attention (per-head q/k rms_norm + rope)"
        assert report.left == []
        calls = _Calls(monkeypatch)
        actual = model(**inputs)[0]
        assert calls.used() == FLUX2_CALLS
        _agree(actual, expected, dtype)
        assert kiln.unpatch(model) == len(report.replaced)
        assert _instance_forwards(model) == []
        assert torch.equal(model(**inputs)[0], expected)


def test_flux2_trains_through_kiln_norms_and_rope(monkeypatch):
    """Recording a graph, the blocks run diffusers' forward and the attentions their norm modules
    and one kiln.rope each; every gradient agrees."""
    used = _trains_as_diffusers(_flux2(torch.float32), _flux2_inputs(torch.float32), lambda: _Calls(monkeypatch))
    assert used["rope"] == 3 and "head_norm_rope" not in used and "gated_adaln" not in used


def test_flux2_blocks_are_left_to_inductor_under_torch_compile():
    """Compiled, the blocks run diffusers' seams (Inductor fuses them) and the attentions still
    normalise and rotate in kiln's launches."""
    graphs = _compiled_patched_graphs(_flux2(torch.float32), _flux2_inputs(torch.float32))
    assert calls_of(graphs, torch.ops.kiln.gated_adaln.default) == []
    assert len(calls_of(graphs, torch.ops.kiln.head_norm_rope.default)) == 2


def test_flux2_single_block_given_both_streams_splits_them_as_diffusers():
    model = _flux2(torch.float32)
    block = model.single_transformer_blocks[0]
    g = torch.Generator().manual_seed(5)
    h, c = torch.randn(2, 12, 32, generator=g), torch.randn(2, 5, 32, generator=g)
    temb = torch.randn(2, 96, generator=g)
    angles = torch.randn(17, 8, generator=g)
    rope = (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1))
    with torch.no_grad():
        expected = block(h, c, temb, rope, None, split_hidden_states=True)
        kiln.patch(model)
        actual = block(h, c, temb, rope, None, split_hidden_states=True)
    for a, e in zip(actual, expected):
        _agree(a, e, torch.float32)
