"""Host work kiln's LTX-Video forward spares: the cross-attention mask prepared once per
forward (kiln/patching/ltx_mask.py) where diffusers prepares it in every block, and the
processor's signature read without introspection on every attention call."""

import gc
import inspect

import pytest
import torch

import kiln

pytest.importorskip("diffusers", reason="diffusers is not installed")

from kiln.patching import flux, ltx, ltx_mask  # noqa: E402
from test_patch_diffusers_cpu import _ltx, _ltx_inputs, _ltx_out  # noqa: E402
from test_patch_dit_cpu import _agree  # noqa: E402


def _count_prepares(monkeypatch, attn_class) -> list:
    calls = []
    original = attn_class.prepare_attention_mask

    def counted(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(attn_class, "prepare_attention_mask", counted)
    return calls


def _masked_inputs():
    inputs = _ltx_inputs(torch.float32)
    inputs["encoder_attention_mask"][1, 3:] = 0  # a padded prompt: the mask matters
    return inputs


def test_the_mask_is_prepared_once_per_forward(monkeypatch):
    model = _ltx(torch.float32)
    inputs = _masked_inputs()
    calls = _count_prepares(monkeypatch, type(model.transformer_blocks[0].attn2))
    expected = _ltx_out(model, inputs)
    assert len(calls) == 2  # diffusers: once per block
    kiln.patch(model)
    for forward in range(2):
        calls.clear()
        _agree(_ltx_out(model, inputs), expected, torch.float32)
        assert len(calls) == 1, forward  # the transformer makes a new mask each forward
    kiln.unpatch(model)


def _attn_and_mask():
    model = _ltx(torch.float32)
    kiln.patch(model)
    mask = torch.zeros(2, 1, 5)
    mask[1, :, 3:] = -10000.0
    return model.transformer_blocks[0].attn2, mask


def _expected(attn, mask, sequence_length=5, batch_size=2):
    prepared = attn.prepare_attention_mask(mask, sequence_length, batch_size)
    return prepared.view(batch_size, attn.heads, -1, prepared.shape[-1])


def test_the_same_unchanged_mask_is_prepared_once():
    attn, mask = _attn_and_mask()
    first = ltx_mask.prepare(attn, mask, 5, 2)
    assert torch.equal(first, _expected(attn, mask))
    assert ltx_mask.prepare(attn, mask, 5, 2) is first


@pytest.mark.parametrize("change", ["mask in place", "prepared in place", "another mask", "another length",
                                    "another batch", "another head count"])
def test_a_changed_mask_or_call_is_prepared_again(change):
    attn, mask = _attn_and_mask()
    first = ltx_mask.prepare(attn, mask, 5, 2)
    length, batch = 5, 2
    if change == "mask in place":
        mask[0, :, 1] = -10000.0
    elif change == "prepared in place":
        first.add_(1.0)
    elif change == "another mask":
        mask = mask.clone()
    elif change == "another length":
        length = 7
    elif change == "another batch":
        batch, mask = 1, mask[:1]
    else:
        attn.heads = 1
    again = ltx_mask.prepare(attn, mask, length, batch)
    assert again is not first
    assert torch.equal(again, _expected(attn, mask, length, batch))


def test_a_mask_that_records_a_graph_is_not_kept():
    attn, mask = _attn_and_mask()
    mask.requires_grad_(True)
    first = ltx_mask.prepare(attn, mask, 5, 2)
    assert first.requires_grad
    assert ltx_mask.prepare(attn, mask, 5, 2) is not first


def test_a_dropped_mask_releases_the_prepared_one():
    attn, mask = _attn_and_mask()
    ltx_mask.prepare(attn, mask, 5, 2)
    assert ltx_mask.prepare._kept is not None
    del mask
    gc.collect()
    assert ltx_mask.prepare._kept is None


def test_the_processor_signature_is_its_code():
    """diffusers drops keyword arguments the processor's signature does not name; the kept
    signature must name exactly the code's parameters."""
    for cls in (ltx.LTXAttnProcessor, flux.FluxAttnProcessor):
        code = cls.__call__.__code__
        assert list(inspect.signature(cls.__call__).parameters) == list(code.co_varnames[:code.co_argcount])
    model = _ltx(torch.float32)
    kiln.patch(model)
    attn = model.transformer_blocks[0].attn1
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        out = attn(x, unknown_argument=1)  # dropped (diffusers logs it), as before the patch
        kiln.unpatch(model)
        expected = attn(x)
    _agree(out, expected, torch.float32)
