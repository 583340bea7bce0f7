"""kiln.patch on a tiny Mochi transformer on a GPU in bf16: as close to the fp32 model as
diffusers' own bf16 forward, with the calls test_patch_mochi_cpu.py counts, for right-padded and
scattered prompt masks, and in a model of Mochi's head count and width."""

import pytest
import torch

import kiln

diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed")
pytest.importorskip("diffusers.models.transformers.transformer_mochi", reason="this diffusers has no Mochi")

from test_patch_dit_cpu import Counter  # noqa: E402
from test_patch_dit_cuda import _as_close_as_the_original  # noqa: E402
from test_patch_mochi_cpu import MOCHI_CALLS, _mochi, _mochi_inputs  # noqa: E402

MASKS = {"right-padded": ((1,) * 8, (1,) * 5 + (0,) * 3),
         "scattered": ((1, 0, 1, 1, 0, 1, 1, 1), (0, 1, 1, 0, 0, 0, 1, 0))}


@pytest.mark.gpu
@pytest.mark.parametrize("mask", list(MASKS))
def test_mochi_tiny_bf16_cuda(monkeypatch, mask):
    with torch.no_grad():
        truth = _mochi(torch.float32, "cuda")(**_mochi_inputs(torch.float32, "cuda", MASKS[mask]))[0]
        model = _mochi(torch.bfloat16, "cuda")
        inputs = _mochi_inputs(torch.bfloat16, "cuda", MASKS[mask])
        original = model(**inputs)[0]
        report = kiln.patch(model)
        # norm1 and norm1_context are computed by the blocks (kiln.adaln), not patched alone.
        assert {entry.cls for entry in report.left} == {"MochiRMSNormZero"}
        counter = Counter(monkeypatch)
        patched = model(**inputs)[0]
        assert counter.used() == MOCHI_CALLS
        _as_close_as_the_original(patched, original, truth)
        kiln.unpatch(model)
        assert torch.equal(model(**inputs)[0], original)


@pytest.mark.gpu
def test_mochi_block_at_mochi_width_bf16_cuda():
    """One block of Mochi's width (24 heads of 128, text 1536 wide): the rotation spans a 3072-wide
    row by a half table of 1536 angles a token."""
    torch.manual_seed(0)
    block = diffusers.models.transformers.transformer_mochi.MochiTransformerBlock(
        dim=3072, num_attention_heads=24, attention_head_dim=128, pooled_projection_dim=1536)
    block = block.eval().cuda()
    g = torch.Generator().manual_seed(2)
    angles = 20 * torch.randn(96, 24, 64, generator=g)
    args = (torch.randn(2, 96, 3072, generator=g), torch.randn(2, 16, 1536, generator=g),
            torch.randn(2, 3072, generator=g), (torch.arange(16)[None] < torch.tensor([[16], [11]])).long(),
            (angles.cos(), angles.sin()))
    args = tuple(a.cuda() if isinstance(a, torch.Tensor) else tuple(t.cuda() for t in a) for a in args)
    with torch.no_grad():
        truth = block(*args)
        half = tuple(a.bfloat16() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        block.bfloat16()
        original = block(*half)
        report = kiln.patch(block)
        kinds = {r.path: r.kind for r in report.replaced}
        assert kinds[""] == "mochi block (modulated rms_norm seams)" and "attn1" in kinds
        patched = block(*half)
    for p, o, t in zip(patched, original, truth):
        _as_close_as_the_original(p, o, t)


@pytest.mark.gpu
def test_mochi_attention_takes_a_mask_on_the_cpu_cuda():
    """An attention called with its prompt mask on the CPU (diffusers' processor indexes the GPU's
    tensors with the mask's indices): kiln's agrees, scattered valid tokens included."""
    model = _mochi(torch.bfloat16, "cuda")
    attn = model.transformer_blocks[0].attn1
    g = torch.Generator().manual_seed(4)
    x, enc = torch.randn(2, 12, 32, generator=g), torch.randn(2, 8, 24, generator=g)
    angles = torch.randn(12, 2, 8, generator=g)
    args = dict(hidden_states=x.cuda().bfloat16(), encoder_hidden_states=enc.cuda().bfloat16(),
                attention_mask=torch.tensor(MASKS["scattered"]), image_rotary_emb=(angles.cos().cuda(),
                                                                                   angles.sin().cuda()))
    with torch.no_grad():
        expected = attn(**args)
        kiln.patch(model)
        actual = attn(**args)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=2e-2, atol=2e-2)
