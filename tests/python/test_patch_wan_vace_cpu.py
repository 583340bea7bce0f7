"""kiln.patch on Wan VACE's transformer (diffusers' WanVACETransformer3DModel), on the CPU: its
control blocks are Wan's blocks over the control stream (the first adds its input projection of
the control to the video stream, each returns its output projection: the hint a main block's
output receives), so Wan's seams (kiln.adaln, kiln.gated_adaln, the next control block's norm
handed over), against diffusers' own forward in fp32 and bf16, under autograd and torch.compile."""

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")

from graph_model import calls_of  # noqa: E402
from test_patch_dit_cpu import (Counter, _agree, _compiled_patched_graphs, _instance_forwards,  # noqa: E402
                                _trains_as_diffusers)
from test_patch_wan_cpu import _wan  # noqa: E402

LAYERS, VACE_LAYERS = 4, (0, 2)


def _vace(dtype, device="cpu"):
    """A tiny Wan VACE transformer in `dtype`, what diffusers' loader keeps in fp32 in fp32."""
    return _wan(dtype, device, "WanVACETransformer3DModel", num_layers=LAYERS, vace_layers=list(VACE_LAYERS),
                vace_in_channels=6)


def _vace_inputs(dtype, device="cpu"):
    g = torch.Generator().manual_seed(3)
    return dict(hidden_states=torch.randn(2, 4, 3, 8, 6, generator=g).to(device, dtype),
                timestep=torch.tensor([500, 300]).to(device),
                encoder_hidden_states=torch.randn(2, 7, 16, generator=g).to(device, dtype),
                control_hidden_states=torch.randn(2, 6, 3, 8, 6, generator=g).to(device, dtype),
                control_hidden_states_scale=torch.tensor([1.0, 0.7]).to(device), return_dict=False)


# Per forward, the control blocks: the first's norm1 AdaLN, two gated_adaln a block and the first's
# last residual with the second's norm1 (handed over). The main blocks: the same chain, but the hint
# the model adds after blocks 0 and 2 changes the stream the next block receives, so blocks 1 and
# 3 compute their own norm1. Every self-attention's q/k norms and rotation, every cross-attention's
# q/k RMSNorms, every feed-forward's GELU, the output norm.
CALLS = {"adaln": 1 + 1 + 2, "gated_adaln": (2 * 2 + 1) + (2 * LAYERS + LAYERS - 1),
         "rms_norm_rope": LAYERS + 2, "rms_norm": 2 * (LAYERS + 2), "gelu": LAYERS + 2, "layer_norm": 1}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wan_vace_patched_agrees_and_unpatch_restores(dtype, monkeypatch):
    model, inputs = _vace(dtype), _vace_inputs(dtype)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = kiln.patch(model)
        kinds = {r.path: r.kind for r in report.replaced}
        seams = "block (adaln, gated residual + norm seams)"
        assert [kinds[f"vace_blocks.{i}"] for i in range(2)] == [f"wan vace {seams}"] * 2
        assert [kinds[f"blocks.{i}"] for i in range(LAYERS)] == [f"wan {seams}"] * LAYERS
        assert report.left == []
        counter = Counter(monkeypatch)
        actual = model(**inputs)[0]
        assert counter.used() == CALLS
        _agree(actual, expected, dtype)
        assert kiln.unpatch(model) == len(report.replaced)
        assert _instance_forwards(model) == []
        assert torch.equal(model(**inputs)[0], expected)


def test_wan_vace_hint_reaches_the_output():
    """The control stream changes the output (so the control blocks above are compared on it)."""
    model, inputs = _vace(torch.float32), _vace_inputs(torch.float32)
    kiln.patch(model)
    with torch.no_grad():
        with_hint = model(**inputs)[0]
        inputs["control_hidden_states_scale"] = torch.zeros(2)
        without = model(**inputs)[0]
    assert not torch.allclose(with_hint, without, atol=1e-3)


def test_wan_vace_trains_as_diffusers(monkeypatch):
    """Recording a graph, the blocks run diffusers' forward; every gradient agrees."""
    used = _trains_as_diffusers(_vace(torch.float32), _vace_inputs(torch.float32), lambda: Counter(monkeypatch))
    assert "gated_adaln" not in used and "rope" in used


def test_wan_vace_under_torch_compile():
    """Compiled, the control blocks' seams stay kiln's (each compiled region its own norm1)."""
    graphs = _compiled_patched_graphs(_vace(torch.float32), _vace_inputs(torch.float32))
    assert len(calls_of(graphs, torch.ops.kiln.gated_adaln.default)) == 2 * (LAYERS + 2)
