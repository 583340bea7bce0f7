"""kiln.patch on CogVideoX-5b's form (diffusers' CogVideoXTransformer3DModel with
use_rotary_positional_embeddings), on the CPU: its attention's rotation of the video tokens' q
and k as one kiln.rope_ in place (with autograd, kiln.rope), against diffusers' own forward (fp32
and bf16), under autograd and under torch.compile."""

import pytest
import torch

import kiln
from kiln import rope_ops

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")

from graph_model import calls_of  # noqa: E402
from test_patch_dit_cpu import (COGVIDEOX_CALLS, Counter, _agree, _cogvideox, _cogvideox_inputs,  # noqa: E402
                                _compiled_patched_graphs, _instance_forwards, _trains_as_diffusers)

ATTENTION = "cogvideox attention (rope of the video tokens' q and k in place)"


def _cogvideox_5b(dtype, device="cpu"):
    return _cogvideox(dtype, device, use_rotary_positional_embeddings=True)


def _rope_inputs(dtype, device="cpu"):
    """CogVideoX's inputs with the pipeline's rotation tables for its 2 x 4 x 4 video tokens
    (interleaved pairs: each angle twice), fp32 as the pipeline makes them."""
    g = torch.Generator().manual_seed(5)
    angles = 30 * torch.randn(32, 8, generator=g)
    rope = (angles.cos().repeat_interleave(2, -1).to(device), angles.sin().repeat_interleave(2, -1).to(device))
    return dict(_cogvideox_inputs(dtype, device), image_rotary_emb=rope)


def _counter(monkeypatch):
    return Counter(monkeypatch, more=((rope_ops, "rope_"),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cogvideox_5b_rotation_is_kiln_rope(dtype, monkeypatch):
    model, inputs = _cogvideox_5b(dtype), _rope_inputs(dtype)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = kiln.patch(model)
        kinds = {r.path: r.kind for r in report.replaced}
        assert kinds["transformer_blocks.0.attn1"] == kinds["transformer_blocks.1.attn1"] == ATTENTION
        assert report.left == []
        counter = _counter(monkeypatch)
        actual = model(**inputs)[0]
        assert counter.used() == dict(COGVIDEOX_CALLS, rope_=2)
        _agree(actual, expected, dtype)
        assert kiln.unpatch(model) == len(report.replaced)
        assert _instance_forwards(model) == []
        assert torch.equal(model(**inputs)[0], expected)


def test_cogvideox_2b_attention_without_rotation_is_diffusers(monkeypatch):
    """CogVideoX-2b rotates nothing: its attention runs diffusers' processor."""
    model, inputs = _cogvideox(torch.float32), _cogvideox_inputs(torch.float32)
    with torch.no_grad():
        expected = model(**inputs)[0]
        kiln.patch(model)
        counter = _counter(monkeypatch)
        _agree(model(**inputs)[0], expected, torch.float32)
        assert "rope_" not in counter.used() and "rope" not in counter.used()


def test_cogvideox_5b_trains_through_kiln_rope(monkeypatch):
    """Recording a graph, the rotation is one kiln.rope written into the slices (the blocks run
    diffusers' seams); every gradient agrees."""
    used = _trains_as_diffusers(_cogvideox_5b(torch.float32), _rope_inputs(torch.float32),
                                lambda: _counter(monkeypatch))
    assert used["rope"] == 2 and "rope_" not in used


def test_cogvideox_5b_under_torch_compile():
    """Compiled, each attention's rotation stays one kiln.rope_ in place."""
    graphs = _compiled_patched_graphs(_cogvideox_5b(torch.float32), _rope_inputs(torch.float32))
    assert len(calls_of(graphs, torch.ops.kiln.rope_.default)) == 2
