"""kiln.patch on a tiny LTX-2 transformer on a GPU in bf16 (LTX-2's split rotation, the
interleaved one, LTX-2.3's gates and text modulation): as close to the fp32 model as diffusers'
own bf16 forward, with the calls test_patch_ltx2_cpu.py counts (the feed-forwards' tanh GELU in
their projections' cuBLASLt epilogue there); and kiln.rope of q alone at LTX-2's widths."""

import pytest
import torch

import kiln
from kiln import rope_ops

pytest.importorskip("diffusers", reason="diffusers is not installed")
pytest.importorskip("diffusers.models.transformers.transformer_ltx2", reason="this diffusers has no LTX-2 transformer")

from test_patch_dit_cpu import Counter  # noqa: E402
from test_patch_dit_cuda import _as_close_as_the_original, _count_epilogues, _on_cuda  # noqa: E402
from test_patch_ltx2_cpu import LTX2_CALLS, LTX23, LTX23_INPUTS, _both, _ltx2, _ltx2_inputs  # noqa: E402

SETTINGS = {"split": ({}, {}, LTX2_CALLS),
            "interleaved": ({"rope_type": "interleaved"}, {}, dict(LTX2_CALLS, rms_norm_rope=4, rope=8, rms_norm=16)),
            "ltx-2.3": (LTX23, LTX23_INPUTS, LTX2_CALLS)}


@pytest.mark.gpu
@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("per_token", [False, True])
def test_ltx2_tiny_bf16_cuda(monkeypatch, setting, per_token):
    config, given, calls = SETTINGS[setting]
    with torch.no_grad():
        truth = _both(_ltx2(torch.float32, "cuda", **config)(**_ltx2_inputs(torch.float32, "cuda", per_token, **given)))
        model = _ltx2(torch.bfloat16, "cuda", **config)
        inputs = _ltx2_inputs(torch.bfloat16, "cuda", per_token, **given)
        original = _both(model(**inputs))
        report = kiln.patch(model)
        assert report.left == []
        counter = _count_epilogues(Counter(monkeypatch), monkeypatch)
        patched = _both(model(**inputs))
        assert counter.used() == _on_cuda(calls)
        _as_close_as_the_original(patched, original, truth)
        kiln.unpatch(model)
        assert torch.equal(_both(model(**inputs)), original)


def _half_split(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], -1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens, heads, head_dim", [(1, 32, 128), (768, 32, 128), (126, 32, 64), (37, 3, 24)])
def test_rope_of_q_alone_cuda(dtype, tokens, heads, head_dim):
    """LTX-2's audio-video attentions rotate q and k by tables of their own: kiln.rope of one
    tensor (a partner of no heads), each token's heads as rows with a half table, forward and
    backward against the fp64 formula, the output poisoned first."""
    g = torch.Generator().manual_seed(tokens)
    q = torch.randn(2, tokens * heads, head_dim, generator=g).to("cuda", dtype).requires_grad_()
    angles = 30 * torch.randn(2, tokens * heads, head_dim // 2, generator=g, dtype=torch.float64)
    cos, sin = angles.cos().float().cuda(), angles.sin().float().cuda()
    out = torch.full_like(q, float("nan"))
    rotated, none = rope_ops.rope(q, q[..., :0], cos, sin, rotary_dim=head_dim, layout="bshd", head_dim=head_dim)
    with torch.no_grad():
        out.copy_(rotated)
    reference = q.detach().double().requires_grad_()
    expected = _half_split(reference, cos.double(), sin.double())
    assert none.shape == (2, tokens * heads, 0)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(out.double(), expected.detach(), rtol=tol, atol=tol * expected.abs().max().item())
    # Its backward (autograd hands the empty k a zero-filled gradient): the inverse rotation.
    dy = torch.randn(q.shape, generator=g).to("cuda", dtype)
    (rotated * dy).sum().backward()
    (expected * dy.double()).sum().backward()
    torch.testing.assert_close(q.grad.double(), reference.grad, rtol=tol, atol=tol * reference.grad.abs().max().item())
