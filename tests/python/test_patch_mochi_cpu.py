"""kiln.patch on Mochi's transformer (diffusers' MochiTransformer3DModel), on the CPU: its
attentions' rotation by per-head tables as one kiln.rope and the valid text tokens found once a
forward, its blocks' modulated RMSNorm seams as kiln.adaln and kiln.gated_adaln, against
diffusers' own forward (fp32 and bf16), with right-padded and scattered prompt masks, under
autograd and under torch.compile."""

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
pytest.importorskip("diffusers.models.transformers.transformer_mochi", reason="this diffusers has no Mochi")

from graph_model import calls_of  # noqa: E402
from test_patch_dit_cpu import (Counter, _agree, _compiled_patched_graphs, _instance_forwards,  # noqa: E402
                                _norms_spread, _trains_as_diffusers)

ATTENTION = "mochi attention (rope of q and k by per-head tables, valid tokens once a forward)"
BLOCK = "mochi block (modulated rms_norm seams)"


def _mochi(dtype, device="cpu"):
    """A tiny Mochi transformer (three blocks, the last one's text stream ending at its norm), its
    norms' weights spread and its rotation frequencies random (they start at zero)."""
    torch.manual_seed(0)
    model = diffusers.MochiTransformer3DModel(patch_size=2, num_attention_heads=2, attention_head_dim=16,
                                              num_layers=3, pooled_projection_dim=24, in_channels=4,
                                              text_embed_dim=16, time_embed_dim=8, max_sequence_length=8).eval()
    with torch.no_grad():
        model.pos_frequencies.normal_()
    return _norms_spread(model).to(device=device, dtype=dtype)


def _mochi_inputs(dtype, device="cpu", mask=((1,) * 8, (1,) * 5 + (0,) * 3)):
    """Two 3-frame 8 x 8 latents (48 tokens) and prompts of 8 tokens, `mask` marking the valid ones."""
    g = torch.Generator().manual_seed(3)
    return dict(hidden_states=torch.randn(2, 4, 3, 8, 8, generator=g).to(device, dtype),
                encoder_hidden_states=torch.randn(2, 8, 16, generator=g).to(device, dtype),
                timestep=torch.tensor([300, 700], device=device),
                encoder_attention_mask=torch.tensor(mask, device=device), return_dict=False)


# Each of the two full blocks: per stream, the norm1 AdaLN, norm2 and norm4 (the gated norms of the
# attention's and the feed-forward's outputs) as adaln, the residual add and norm3 as one
# gated_adaln; the last block: the video stream's four calls and the text's norm1 adaln. The
# attentions: four per-head norms (rms_norm) and one rope each; the output AdaLN.
MOCHI_CALLS = {"adaln": 17, "gated_adaln": 5, "rms_norm": 12, "rope": 3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mochi_patched_agrees_and_unpatch_restores(dtype, monkeypatch):
    model, inputs = _mochi(dtype), _mochi_inputs(dtype)
    with torch.no_grad():
        expected = model(**inputs)[0]
        report = kiln.patch(model)
        kinds = {r.path: r.kind for r in report.replaced}
        assert kinds["transformer_blocks.0"] == kinds["transformer_blocks.2"] == BLOCK
        assert kinds["transformer_blocks.0.attn1"] == kinds["transformer_blocks.2.attn1"] == ATTENTION
        counter = Counter(monkeypatch)
        actual = model(**inputs)[0]
        assert counter.used() == MOCHI_CALLS
        _agree(actual, expected, dtype)
        assert kiln.unpatch(model) == len(report.replaced)
        assert _instance_forwards(model) == []
        assert torch.equal(model(**inputs)[0], expected)


@pytest.mark.parametrize("mask", [((1,) * 8, (1,) * 8), ((1, 0, 1, 1, 0, 1, 1, 1), (0, 1, 1, 0, 0, 0, 1, 0)),
                                  ((1,) * 8, (1, 1, 0, 1, 0, 0, 0, 0))])
def test_mochi_prompt_masks(mask):
    """Unpadded prompts, valid tokens scattered in both entries, and one entry of each kind: the
    patched model agrees (diffusers gathers the valid tokens; kiln slices them where they come
    first)."""
    model, inputs = _mochi(torch.float32), _mochi_inputs(torch.float32, mask=mask)
    with torch.no_grad():
        expected = model(**inputs)[0]
        kiln.patch(model)
        _agree(model(**inputs)[0], expected, torch.float32)


def test_mochi_finds_the_valid_tokens_once_a_forward(monkeypatch):
    """The valid text tokens (a host sync to find) are found once a forward, not once a block; the
    same mask, unchanged, is not read again; a new mask (or a changed one) is."""
    from kiln.patching import mochi

    found = []
    valid_tokens = mochi._valid_tokens

    def counted(attention_mask):
        found.append(attention_mask.shape)
        return valid_tokens(attention_mask)

    monkeypatch.setattr(mochi, "_valid_tokens", counted)
    model, inputs = _mochi(torch.float32), _mochi_inputs(torch.float32)
    with torch.no_grad():
        expected = model(**inputs)[0]
        kiln.patch(model)
        found.clear()  # the probes'
        for _ in range(2):
            _agree(model(**inputs)[0], expected, torch.float32)
            assert found == [(2, 8)]
        inputs["encoder_attention_mask"] = inputs["encoder_attention_mask"].clone()
        _agree(model(**inputs)[0], expected, torch.float32)
        inputs["encoder_attention_mask"][0, 7] = 0
        model(**inputs)
        assert found == [(2, 8)] * 3
    assert valid_tokens(torch.tensor([[1, 1, 0], [1, 1, 1]])) == [2, 3]
    scattered = valid_tokens(torch.tensor([[1, 0, 1], [0, 0, 0]]))
    assert torch.equal(scattered[0], torch.tensor([0, 2])) and scattered[1] == 0


def test_mochi_rotation_reads_per_head_tables():
    """Mochi's tables hold an angle per token, head and pair: kiln's one rotation of the whole row
    gives each head its own angles, as diffusers' formula does (bf16 q and k, fp32 tables)."""
    from kiln.patching.mochi import MochiAttnProcessor

    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 5, 3, 8, generator=g).bfloat16() for _ in range(2))
    angles = 30 * torch.randn(5, 3, 4, generator=g)
    cos, sin = angles.cos(), angles.sin()
    for x, rotated in zip((q, k), MochiAttnProcessor._rotated(q, k, (cos, sin))):
        even, odd = x[..., 0::2].double(), x[..., 1::2].double()
        expected = torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)
        assert rotated.dtype == torch.bfloat16
        torch.testing.assert_close(rotated.double(), expected, rtol=2**-8, atol=2**-8)


def test_mochi_trains_as_diffusers(monkeypatch):
    """Recording a graph (the rotation frequencies train), the blocks and the rotation run
    diffusers' formulas (the output AdaLN alone is kiln's, which has a backward); every gradient
    agrees."""
    used = _trains_as_diffusers(_mochi(torch.float32), _mochi_inputs(torch.float32), lambda: Counter(monkeypatch))
    assert used["adaln"] == 1 and "gated_adaln" not in used and "rope" not in used


def test_mochi_under_torch_compile():
    """Compiled, the blocks' seams stay kiln's; the attentions run diffusers' (Inductor fuses the
    rotation, and diffusers' loop over the batch is what it traces)."""
    graphs = _compiled_patched_graphs(_mochi(torch.float32), _mochi_inputs(torch.float32))
    assert len(calls_of(graphs, torch.ops.kiln.gated_adaln.default)) == 5
    assert calls_of(graphs, torch.ops.kiln.rope.default) == []


def test_mochi_attention_reads_a_mask_of_another_shape_as_diffusers():
    """A [B, 1, L] mask (not the model's [B, L]) runs diffusers' loop, which reads it flattened."""
    model, inputs = _mochi(torch.float32), _mochi_inputs(torch.float32)
    attn = model.transformer_blocks[0].attn1
    g = torch.Generator().manual_seed(4)
    x, enc = torch.randn(2, 12, 32, generator=g), torch.randn(2, 8, 24, generator=g)
    angles = torch.randn(12, 2, 8, generator=g)
    mask = inputs["encoder_attention_mask"][:, None]
    with torch.no_grad():
        expected = attn(x, encoder_hidden_states=enc, attention_mask=mask, image_rotary_emb=(angles.cos(), angles.sin()))
        kiln.patch(model)
        actual = attn(x, encoder_hidden_states=enc, attention_mask=mask, image_rotary_emb=(angles.cos(), angles.sin()))
    for a, e in zip(actual, expected):
        assert torch.equal(a, e)
