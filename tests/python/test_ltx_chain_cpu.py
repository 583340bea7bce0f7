"""The seam between consecutive patched LTX-Video blocks (kiln/patching/dit_block_chain.py): block
i's last residual and block i + 1's norm1 AdaLN in one gated_adaln, the norm handed over.
Block i + 1 must take it only for the very h and temb it was computed from, unchanged; a
hook on the next block, a compiled region or a block patched alone gets no hand-over."""

import pytest
import torch

import kiln

pytest.importorskip("diffusers", reason="diffusers is not installed")

from graph_model import calls_of, compile_capturing  # noqa: E402
from test_patch_diffusers_cpu import _ltx, _ltx_inputs, _ltx_out  # noqa: E402
from test_patch_dit_cpu import LTX_FUSED, Counter, _agree  # noqa: E402

UNCHAINED = dict(LTX_FUSED, adaln=2, gated_adaln=2, gated_residual_=2)


def _block_inputs(model, seed=0):
    """hidden_states, encoder_hidden_states, temb, rotary embedding, mask for one block."""
    g = torch.Generator().manual_seed(seed)
    d = model.config.num_attention_heads * model.config.attention_head_dim
    h = torch.randn(2, 12, d, generator=g)
    enc = torch.randn(2, 5, d, generator=g)
    temb = torch.randn(2, 1, 6 * d, generator=g)
    mask = torch.zeros(2, 1, 5)
    mask[1, :, 3:] = -10000.0
    return h, enc, temb, model.rope(h, 2, 2, 3, (0.32, 32.0, 32.0)), mask


@pytest.mark.parametrize("change", ["in place", "another h", "another temb"])
def test_the_next_block_takes_the_norm_only_for_its_own_inputs(change, monkeypatch):
    model = _ltx(torch.float32)
    h, enc, temb, rope, mask = _block_inputs(model)
    b0, b1 = model.transformer_blocks
    with torch.no_grad():
        ref0 = b0(h, enc, temb, rope, mask)
    kiln.patch(model)
    counter = Counter(monkeypatch)
    with torch.no_grad():
        out0 = b0(h, enc, temb, rope, mask)
        _agree(out0, ref0, torch.float32)
        assert counter.calls["gated_adaln"] == 2 and counter.calls["gated_residual_"] == 0  # handed over
        temb1 = temb
        if change == "in place":
            out0.add_(0.5)
        elif change == "another h":
            out0 = out0 * 2
        else:
            temb1 = temb + 0.25
        actual = b1(out0, enc, temb1, rope, mask)
        assert counter.calls["adaln"] == 2  # b1 computed its own norm1
        kiln.unpatch(model)
        expected = b1(out0, enc, temb1, rope, mask)
    _agree(actual, expected, torch.float32)


def test_the_hand_over_is_taken_in_a_forward(monkeypatch):
    model = _ltx(torch.float32)
    inputs = _ltx_inputs(torch.float32)
    expected = _ltx_out(model, inputs)
    kiln.patch(model)
    counter = Counter(monkeypatch)
    _agree(_ltx_out(model, inputs), expected, torch.float32)
    assert counter.used() == LTX_FUSED
    kiln.unpatch(model)
    kiln.patch(model)  # linked again
    counter = Counter(monkeypatch)
    _agree(_ltx_out(model, inputs), expected, torch.float32)
    assert counter.used() == LTX_FUSED


def _hook_on_the_next_block(model):
    model.transformer_blocks[1].register_forward_pre_hook(lambda module, args: None)


def _patch_block_by_block(model):
    for block in model.transformer_blocks:
        kiln.unpatch(block)
        kiln.patch(block)


@pytest.mark.parametrize("then", [_hook_on_the_next_block, _patch_block_by_block])
def test_no_hand_over_to_a_hooked_or_unchained_block(then, monkeypatch):
    model = _ltx(torch.float32)
    inputs = _ltx_inputs(torch.float32)
    expected = _ltx_out(model, inputs)
    kiln.patch(model)
    then(model)
    counter = Counter(monkeypatch)
    _agree(_ltx_out(model, inputs), expected, torch.float32)
    assert counter.used() == UNCHAINED


def test_no_hand_over_in_a_compiled_graph():
    model = _ltx(torch.float32)
    inputs = _ltx_inputs(torch.float32)
    expected = _ltx_out(model, inputs)
    kiln.patch(model)
    compiled, graphs = compile_capturing(model)
    with torch.no_grad():
        actual = compiled(**inputs)[0]
    torch._dynamo.reset()
    assert len(graphs) == 1
    assert len(calls_of(graphs, torch.ops.kiln.adaln.default)) == 2
    assert len(calls_of(graphs, torch.ops.kiln.gated_adaln.default)) == 2
    _agree(actual, expected, torch.float32)
