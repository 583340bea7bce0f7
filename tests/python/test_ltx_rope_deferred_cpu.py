"""LTX-Video's patched rotary embedding defers diffusers' cos/sin tables: kiln's processor
computes the angles from the grid, so a patched forward never builds them, and anything
that reads the pair (a fallback path, a hook, a caller) gets exactly diffusers' tables,
built once. Hooks and compiled graphs get the tuple as diffusers returns it."""

import pytest
import torch

import kiln
from kiln.patching.ltx_rope import DeferredVideoRotaryEmbedding, VideoRotaryEmbedding

pytest.importorskip("diffusers", reason="diffusers is not installed")

from test_patch_diffusers_cpu import _ltx, _ltx_inputs, _ltx_out  # noqa: E402
from test_patch_dit_cpu import LTX_FUSED, Counter, _agree, _loss_grads  # noqa: E402


def _count_builds(model, monkeypatch):
    """Counts the original forward's table builds (each starts from the grid's coordinates)."""
    builds = []
    real = model.rope._prepare_video_coords

    def counted(*args, **kwargs):
        builds.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(model.rope, "_prepare_video_coords", counted)
    return builds


def _rope_args(inputs):
    return (inputs["hidden_states"], inputs["num_frames"], inputs["height"], inputs["width"], (0.32, 32.0, 32.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_patched_forward_never_builds_the_tables(dtype, monkeypatch):
    model = _ltx(dtype)
    inputs = _ltx_inputs(dtype)
    expected = _ltx_out(model, inputs)
    kiln.patch(model)
    builds = _count_builds(model, monkeypatch)
    counter = Counter(monkeypatch)
    actual = _ltx_out(model, inputs)
    assert builds == [] and counter.used() == LTX_FUSED
    _agree(actual, expected, dtype)


def test_reading_the_pair_builds_diffusers_tables_once(monkeypatch):
    model = _ltx(torch.float32)
    args = _rope_args(_ltx_inputs(torch.float32))
    expected = model.rope(*args)
    kiln.patch(model)
    builds = _count_builds(model, monkeypatch)
    pair = model.rope(*args)
    assert isinstance(pair, DeferredVideoRotaryEmbedding) and len(pair) == 2 and builds == []
    assert pair.grid == tuple(args[1:4]) and pair.scale == (0.32, 32.0, 32.0)
    cos, sin = pair
    assert builds == [1]
    assert torch.equal(cos, expected[0]) and torch.equal(sin, expected[1])
    assert pair[0] is cos and list(pair)[1] is sin and builds == [1]
    assert "tables built" in repr(pair)


def test_c_code_cannot_read_the_pair_unbuilt():
    """torch's argument parser reads a tuple's items directly; the deferred pair is not one,
    so it raises rather than handing over something that is not the tables."""
    model = _ltx(torch.float32)
    kiln.patch(model)
    pair = model.rope(*_rope_args(_ltx_inputs(torch.float32)))
    with pytest.raises(TypeError):
        torch.cat(pair)


def test_a_fallback_path_builds_the_tables_once_per_forward(monkeypatch):
    """With autograd recording, the fused ops take diffusers' path, whose apply_rotary_emb
    unpacks the pair in each block's attention: one build serves them all."""
    model = _ltx(torch.float32)
    inputs = _ltx_inputs(torch.float32)
    expected, grads = _loss_grads(model, inputs)
    kiln.patch(model)
    builds = _count_builds(model, monkeypatch)
    actual = model(**inputs)[0]
    assert builds == [1]
    _agree(actual, expected, torch.float32)
    actual.pow(2).mean().backward()
    for name, grad in grads.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, rtol=1e-4, atol=1e-6)


def test_a_hook_on_the_rope_sees_the_tuple(monkeypatch):
    model = _ltx(torch.float32)
    inputs = _ltx_inputs(torch.float32)
    expected = _ltx_out(model, inputs)
    kiln.patch(model)
    seen = []
    model.rope.register_forward_hook(lambda module, args, out: seen.append(out))
    counter = Counter(monkeypatch)
    actual = _ltx_out(model, inputs)
    assert len(seen) == 1 and isinstance(seen[0], VideoRotaryEmbedding) and isinstance(seen[0], tuple)
    assert seen[0].grid == (2, 2, 3) and counter.calls["rms_norm_rope grid"] == 2
    _agree(actual, expected, torch.float32)


def test_a_compiled_block_takes_the_deferred_pair(monkeypatch):
    """Regional compilation: the rotary embedding runs eagerly and its deferred pair is an
    input of each compiled block, which reads the grid (fullgraph: no graph break)."""
    model = _ltx(torch.float32)
    inputs = _ltx_inputs(torch.float32)
    expected = _ltx_out(model, inputs)
    kiln.patch(model)
    builds = _count_builds(model, monkeypatch)
    torch._dynamo.reset()
    blocks = model.transformer_blocks
    originals = list(blocks)
    try:
        for i, block in enumerate(originals):
            blocks[i] = torch.compile(block, fullgraph=True)
        actual = _ltx_out(model, inputs)
    finally:
        for i, block in enumerate(originals):
            blocks[i] = block
        torch._dynamo.reset()
    assert builds == []
    _agree(actual, expected, torch.float32)
