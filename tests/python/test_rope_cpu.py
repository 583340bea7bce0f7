"""The RoPE ops' CPU implementations (kiln's registered references) against the
transformers and diffusers formulas in fp64, and their argument checks."""

import math

import pytest
import torch

import kiln
from reference import TOLERANCE, assert_close_to
from rope_reference import (unrelated_cos_sin, wan_apply_rotary_emb, deepseek_apply_rotary_pos_emb_interleave,
                            diffusers_apply_rotary_emb, gpt_oss_apply_rotary_pos_emb,
                            hf_apply_rotary_pos_emb, llama_cos_sin, ltx_apply_rotary_emb,
                            ltx_video_table, rms_norm_across_heads, transformers_qk)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
def assert_video_close(out, ref, dtype, cos, x):
    """Video angles reach pi/2 * theta * |2 g - 1| (1.6e4 rad and more), where fp32 holds an
    angle only to ~1e-3 rad: diffusers' own fp32 table is that far from fp64. An angle error
    moves an output by up to the pair's norm times it, so the tolerance is the dtype's plus
    the largest pair norm of x times the largest angle error of an fp32 evaluation (see
    video_reference)."""
    assert out.shape == ref.shape and not torch.isnan(out).any()
    angle_error = _video_angle_error(cos)
    assert angle_error > 0, "the table must come from video_reference"
    largest_pair = x.double().unflatten(-1, (-1, 2)).norm(dim=-1).max().item()
    tol = TOLERANCE[dtype] + largest_pair * angle_error
    err = ((out.double() - ref).abs() / ref.abs().clamp_min(1.0)).max().item()
    assert err <= tol, f"max relative error {err:.3e} > {tol:.3e}"


_ANGLES = {}


def _video_angle_error(cos):
    return _ANGLES.get(id(cos), 0.0)


def video_reference(batch, dim, frames, height, width, scale, **kw):
    """The table and its largest angle (recorded for the tolerance)."""
    cos, sin = ltx_video_table(batch, dim, frames, height, width, rope_interpolation_scale=scale, **kw)
    theta = kw.get("theta", 10000.0)
    if scale is None:
        largest_coordinate = max(frames, height, width) - 1
    else:
        base = [kw.get("base_num_frames", 20), kw.get("base_height", 2048), kw.get("base_width", 2048)]
        patch = [kw.get("patch_size_t", 1), kw.get("patch_size", 1), kw.get("patch_size", 1)]
        largest_coordinate = max((n - 1) * s * p / b for n, s, p, b in
                                 zip((frames, height, width), scale, patch, base))
    # An fp32 angle freq * (2 g - 1), freq = theta ** (i / (n - 1)) * pi / 2, is off by eight
    # half-ulps of itself (the roundings of the exponent, pow, the two products and the
    # sin/cos) plus what the exponent's rounding (a half-ulp of log2(theta), twice: its step
    # and its product) becomes through pow: ln(2) * log2(theta) of it.
    largest_angle = theta * math.pi / 2 * max(1.0, abs(2 * largest_coordinate - 1))
    half_ulps = 8 + 2 * math.log(2) * math.log2(theta)
    _ANGLES[id(cos)] = largest_angle * half_ulps * 2.0 ** -24
    return cos, sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq", [1, 7, 33])
@pytest.mark.parametrize("table_fp32", [True, False])
def test_half_split_bhsd_matches_transformers(dtype, seq, table_fp32):
    q = torch.randn(2, 4, seq, 64).to(dtype)
    k = torch.randn(2, 2, seq, 64).to(dtype)  # grouped-query attention: fewer k heads
    cos, sin = llama_cos_sin(2, seq, 64, positions=torch.randint(0, 4096, (2, seq)))
    if not table_fp32:
        cos, sin = cos.to(dtype), sin.to(dtype)
    q_out, k_out = kiln.rope(q, k, cos, sin)
    q_ref, k_ref = hf_apply_rotary_pos_emb(q, k, cos, sin)
    assert q_out.dtype == dtype and k_out.shape == k.shape
    assert_close_to(q_out, q_ref, dtype)
    assert_close_to(k_out, k_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotary_dim", [32, 64])
def test_partial_rotary_and_unsqueezed_table(dtype, rotary_dim):
    q = torch.randn(1, 3, 9, 96).to(dtype)
    k = torch.randn(1, 1, 9, 96).to(dtype)
    cos, sin = llama_cos_sin(1, 9, rotary_dim)
    # transformers' own unsqueeze(1) form, broadcast over batch.
    q_out, k_out = kiln.rope(q, k, cos.unsqueeze(1), sin.unsqueeze(1))
    q_ref, k_ref = hf_apply_rotary_pos_emb(q, k, cos, sin)
    assert_close_to(q_out, q_ref, dtype)
    assert_close_to(k_out, k_ref, dtype)
    # rotary_dim picks the first columns of a wider table.
    wide_cos, wide_sin = torch.randn(9, 96), torch.randn(9, 96)
    q2, _ = kiln.rope(q, k, wide_cos, wide_sin, rotary_dim=rotary_dim)
    ref2, _ = hf_apply_rotary_pos_emb(q, k, wide_cos[None, :, :rotary_dim], wide_sin[None, :, :rotary_dim])
    assert_close_to(q2, ref2, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq", [1, 15])
def test_interleaved_matches_diffusers_both_layouts(dtype, seq):
    q = torch.randn(2, 3, seq, 32).to(dtype)
    k = torch.randn(2, 3, seq, 32).to(dtype)
    cos, sin = torch.randn(seq, 32), torch.randn(seq, 32)  # any table, not only unit pairs
    q_ref = diffusers_apply_rotary_emb(q, cos, sin)
    k_ref = diffusers_apply_rotary_emb(k, cos, sin)
    q_out, k_out = kiln.rope(q, k, cos, sin, interleaved=True)
    assert_close_to(q_out, q_ref, dtype)
    assert_close_to(k_out, k_ref, dtype)
    # [B, S, H, D] and the flattened [B, S, H*D] (head_dim from cos), same results.
    q_bshd, k_bshd = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
    q4, _ = kiln.rope(q_bshd, k_bshd, cos, sin, interleaved=True, layout="bshd")
    assert_close_to(q4, q_ref.transpose(1, 2), dtype)
    q3, k3 = kiln.rope(q_bshd.flatten(2), k_bshd.flatten(2), cos, sin, interleaved=True, layout="bshd")
    assert q3.shape == (2, seq, 96)
    assert_close_to(q3, q_ref.transpose(1, 2).flatten(2), dtype)
    assert_close_to(k3, k_ref.transpose(1, 2).flatten(2), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ltx_table_over_the_whole_row(dtype):
    # LTX-Video: q, k [B, S, C] with a [B, S, C] fp32 table spanning all heads.
    cos, sin = ltx_video_table(2, 96, 2, 3, 4, rope_interpolation_scale=(0.32, 32, 32))
    q = torch.randn(2, 24, 96).to(dtype)
    k = torch.randn(2, 24, 96).to(dtype)
    q_out, k_out = kiln.rope(q, k, cos.float(), sin.float(), interleaved=True, layout="bshd")
    assert_close_to(q_out, ltx_apply_rotary_emb(q, cos, sin), dtype)
    assert_close_to(k_out, ltx_apply_rotary_emb(k, cos, sin), dtype)


def gpt_oss_cos_sin(batch, seq, dim, dtype=torch.float32):
    """GPT-OSS's rotary embedding: [B, S, D / 2], one angle a pair, at random positions."""
    inv_freq = 1.0 / (150000.0 ** (torch.arange(0, dim, 2).double() / dim))
    angles = torch.randint(0, 4096, (batch, seq)).double()[..., None] * inv_freq
    return angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq", [1, 7])
@pytest.mark.parametrize("table_fp32", [True, False])
@pytest.mark.parametrize("heads_inner", [False, True])
def test_half_table_matches_gpt_oss(dtype, seq, table_fp32, heads_inner):
    """A table of rotary_dim / 2 angles (GPT-OSS's) against GPT-OSS's formula, on q and k as
    transformers hands them over ([B, S, H, D] memory) and contiguous."""
    q, k = transformers_qk(2, 4, 2, seq, 64, dtype, heads_inner, device="cpu")
    cos, sin = gpt_oss_cos_sin(2, seq, 64, torch.float32 if table_fp32 else dtype)
    q_out, k_out = kiln.rope(q, k, cos, sin, rotary_dim=64)
    q_ref, k_ref = gpt_oss_apply_rotary_pos_emb(q, k, cos, sin)
    assert q_out.dtype == dtype and q_out.stride() == q.stride()
    assert_close_to(q_out, q_ref, dtype)
    assert_close_to(k_out, k_ref, dtype)


@pytest.mark.parametrize("interleaved", [False, True])
def test_half_table_is_the_full_table_with_each_angle_once(interleaved):
    """A full table whose pairs repeat their angle (transformers' cat(freqs, freqs), diffusers'
    repeat_interleave) and its half give the same bits, partial rotary and the backward too."""
    q, k = torch.randn(2, 3, 9, 96).bfloat16(), torch.randn(2, 1, 9, 96).bfloat16()
    angles = torch.rand(9, 32) * 50
    full = (lambda t: t.repeat_interleave(2, -1)) if interleaved else (lambda t: torch.cat((t, t), -1))
    for rotary_dim in (64, 32):
        half_cos, half_sin = angles[:, :rotary_dim // 2].cos(), angles[:, :rotary_dim // 2].sin()
        expected = kiln.rope(q, k, full(half_cos), full(half_sin), interleaved)
        got = kiln.rope(q, k, half_cos, half_sin, interleaved, rotary_dim=rotary_dim)
        for e, g in zip(expected, got):
            torch.testing.assert_close(g, e, rtol=0, atol=0)
        back = torch.ops.kiln.rope_backward(q, k, half_cos, half_sin, interleaved, rotary_dim)
        back_full = torch.ops.kiln.rope_backward(q, k, full(half_cos), full(half_sin), interleaved)
        for e, g in zip(back_full, back):
            torch.testing.assert_close(g, e, rtol=0, atol=0)
    # transformers' [.., D] table cut to its first half: a strided view, read as it is.
    cos, sin = llama_cos_sin(2, 9, 96)
    expected = kiln.rope(q, k, cos, sin)
    got = kiln.rope(q, k, cos[..., :48], sin[..., :48], rotary_dim=96)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)


def test_half_table_gradients_against_fp64():
    q = torch.randn(1, 2, 5, 32, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 5, 32, dtype=torch.float64, requires_grad=True)
    cos, sin = gpt_oss_cos_sin(1, 5, 32, torch.float64)
    torch.autograd.gradcheck(lambda q, k: kiln.rope(q, k, cos, sin, rotary_dim=32), (q, k))
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    got = torch.autograd.grad(kiln.rope(q, k, cos, sin, rotary_dim=32), (q, k), (dq, dk))
    expected = torch.autograd.grad(gpt_oss_apply_rotary_pos_emb(q, k, cos, sin), (q, k), (dq, dk))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def mla_qk(batch, heads, seq, dim, dtype):
    """DeepSeek-V3's q_rot and k_rot as its attention hands them over: q_rot the last columns of
    each [B, S, H, nope + rope] head viewed [B, H, S, rope], k_rot the last columns of the
    compressed kv row [B, S, kv_lora_rank + rope] viewed [B, 1, S, rope]."""
    q = torch.randn(batch, seq, heads, 16 + dim).to(dtype).transpose(1, 2)[..., 16:]
    k = torch.randn(batch, seq, 32 + dim).to(dtype)[..., 32:].view(batch, 1, seq, dim)
    return q, k


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq", [1, 7])
@pytest.mark.parametrize("half_table", [False, True])
def test_deinterleave_matches_deepseek_v3(dtype, seq, half_table):
    """deinterleave=True against DeepSeek-V3's apply_rotary_pos_emb_interleave (its MLA's
    rope_interleave) in fp64, on the views its attention hands over, from its [B, S, D] table
    in the model's dtype and from the first half of it."""
    q, k = mla_qk(2, 4, seq, 64, dtype)
    cos, sin = llama_cos_sin(2, seq, 64)
    cos, sin = cos.to(dtype), sin.to(dtype)
    q_ref, k_ref = deepseek_apply_rotary_pos_emb_interleave(q, k, cos, sin)
    if half_table:
        cos, sin = cos[..., :32], sin[..., :32]
    q_out, k_out = kiln.rope(q, k, cos, sin, rotary_dim=64, deinterleave=True)
    assert q_out.dtype == dtype and q_out.shape == q.shape and k_out.shape == k.shape
    assert_close_to(q_out, q_ref, dtype)
    assert_close_to(k_out, k_ref, dtype)


def test_deinterleave_partial_rotation_passes_the_rest_through():
    """With rotary_dim < D only the first rotary_dim columns are de-interleaved and rotated."""
    q, k = torch.randn(1, 3, 5, 48, dtype=torch.float64), torch.randn(1, 1, 5, 48, dtype=torch.float64)
    cos, sin = llama_cos_sin(1, 5, 32)
    q_out, k_out = kiln.rope(q, k, cos.double(), sin.double(), deinterleave=True)
    for out, x in ((q_out, q), (k_out, k)):
        expected, _ = deepseek_apply_rotary_pos_emb_interleave(x[..., :32], x[..., :32], cos, sin)
        torch.testing.assert_close(out[..., :32], expected)
        assert torch.equal(out[..., 32:], x[..., 32:])


def test_deinterleave_gradients_against_fp64():
    q = torch.randn(1, 2, 5, 32, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 5, 32, dtype=torch.float64, requires_grad=True)
    cos, sin = llama_cos_sin(1, 5, 32)
    cos, sin = cos.double(), sin.double()
    torch.autograd.gradcheck(lambda q, k: kiln.rope(q, k, cos, sin, deinterleave=True), (q, k))
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    got = torch.autograd.grad(kiln.rope(q, k, cos[..., :16], sin[..., :16], rotary_dim=32, deinterleave=True),
                              (q, k), (dq, dk))
    expected = torch.autograd.grad(deepseek_apply_rotary_pos_emb_interleave(q, k, cos, sin), (q, k), (dq, dk))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def test_deinterleave_in_place_and_bad_combination():
    q, k = torch.randn(2, 4, 7, 64), torch.randn(2, 1, 7, 64)
    cos, sin = llama_cos_sin(2, 7, 64)
    expected = kiln.rope(q, k, cos, sin, deinterleave=True)
    q2, k2 = q.clone(), k.clone()
    kiln.rope_(q2, k2, cos, sin, deinterleave=True)
    torch.testing.assert_close(q2, expected[0], rtol=0, atol=0)
    torch.testing.assert_close(k2, expected[1], rtol=0, atol=0)
    for call in (lambda: kiln.rope(q, k, cos, sin, interleaved=True, deinterleave=True),
                 lambda: torch.ops.kiln.rope_backward(q, k, cos, sin, True, -1, "bhsd", -1, True)):
        with pytest.raises(ValueError, match=r"kiln\.rope(_backward)?: deinterleave: expected false with "
                                             r"interleaved=True"):
            call()


@pytest.mark.parametrize("interleaved", [False, True])
def test_in_place_matches_out_of_place(interleaved):
    q = torch.randn(2, 4, 11, 64)
    k = torch.randn(2, 1, 11, 64)
    cos, sin = torch.randn(11, 48), torch.randn(11, 48)  # partial: 16 columns untouched
    expected_q, expected_k = kiln.rope(q, k, cos, sin, interleaved)
    q2, k2 = q.clone(), k.clone()
    assert kiln.rope_(q2, k2, cos, sin, interleaved) is None
    torch.testing.assert_close(q2, expected_q, rtol=0, atol=0)
    torch.testing.assert_close(k2, expected_k, rtol=0, atol=0)
    assert torch.equal(q2[..., 48:], q[..., 48:])


def test_non_contiguous_inputs():
    base = torch.randn(2, 7, 4, 64)
    q = base.transpose(1, 2)  # a bhsd view of bshd memory
    k = torch.randn(2, 2, 7, 128)[..., ::2]  # strided last dimension
    cos, sin = llama_cos_sin(2, 7, 64)
    q_out, k_out = kiln.rope(q, k, cos, sin)
    q_ref, k_ref = hf_apply_rotary_pos_emb(q, k, cos, sin)
    assert_close_to(q_out, q_ref, torch.float32)
    assert_close_to(k_out, k_ref, torch.float32)


def test_outputs_laid_out_as_inputs():
    """transformers' q and k are [B, S, H, D] in memory, viewed as [B, H, S, D]: the rotated
    tensors and their gradients keep that layout (as torch's elementwise ops and the in-place
    rotations of other libraries do), and the fakes give the same strides. A strided last
    dimension gets a contiguous result."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q = torch.randn(2, 7, 4, 64).transpose(1, 2).requires_grad_()
    k = torch.randn(2, 7, 2, 64).transpose(1, 2).requires_grad_()
    cos, sin = llama_cos_sin(2, 7, 64)
    q_out, k_out = kiln.rope(q, k, cos, sin)
    eager_q, eager_k = hf_apply_rotary_pos_emb(q.detach(), k.detach(), cos, sin)
    assert q_out.stride() == q.stride() and k_out.stride() == k.stride()
    assert_close_to(q_out, eager_q, torch.float32)
    dq = torch.randn(2, 7, 4, 64).transpose(1, 2)
    dk = torch.randn(2, 7, 2, 64).transpose(1, 2)
    grad_q, grad_k = torch.autograd.grad((q_out, k_out), (q, k), (dq, dk))
    assert grad_q.stride() == dq.stride() and grad_k.stride() == dk.stride()
    ref_q, ref_k = torch.ops.kiln.rope_backward(dq, dk, cos, sin)
    torch.testing.assert_close(grad_q, ref_q, rtol=0, atol=0)
    plain = [t.detach() for t in (q, k, cos, sin)]
    with FakeTensorMode() as mode:
        fq, fk, fcos, fsin = (mode.from_tensor(t) for t in plain)
        fake_q, fake_k = torch.ops.kiln.rope(fq, fk, fcos, fsin)
        fake_dq, _ = torch.ops.kiln.rope_backward(mode.from_tensor(dq), mode.from_tensor(dk), fcos, fsin)
    assert fake_q.stride() == q_out.stride() and fake_k.stride() == k_out.stride()
    assert fake_dq.stride() == grad_q.stride()
    strided = torch.randn(2, 2, 7, 128)[..., ::2]
    out, _ = kiln.rope(strided, strided, cos, sin)
    assert out.is_contiguous()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim,scale", [(96, (0.32, 32, 32)), (2048, (0.32, 32, 32)), (100, None)])
def test_rope_3d_matches_ltx_video(dtype, dim, scale):
    frames, height, width = 3, 4, 5
    seq = frames * height * width
    cos, sin = video_reference(2, dim, frames, height, width, scale)
    q = torch.randn(2, seq, dim).to(dtype)
    k = torch.randn(2, seq, dim).to(dtype)
    q_out, k_out = kiln.rope_3d(q, k, frames, height, width, scale)
    assert_video_close(q_out, ltx_apply_rotary_emb(q, cos, sin), dtype, cos, q)
    assert_video_close(k_out, ltx_apply_rotary_emb(k, cos, sin), dtype, cos, k)


def test_rope_3d_patch_and_base_sizes():
    cos, sin = video_reference(1, 60, 2, 2, 3, (0.5, 16, 8), base_num_frames=10,
                               base_height=512, base_width=256, patch_size=2, patch_size_t=3,
                               theta=500.0)
    q, k = torch.randn(1, 12, 60), torch.randn(1, 12, 60)
    q_out, _ = kiln.rope_3d(q, k, 2, 2, 3, (0.5, 16, 8), base_num_frames=10, base_height=512,
                            base_width=256, patch_size=2, patch_size_t=3, theta=500.0)
    assert_video_close(q_out, ltx_apply_rotary_emb(q, cos, sin), torch.float32, cos, q)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("video", [False, True])
def test_rms_norm_rope_matches_ltx_attention(dtype, video):
    frames, height, width, dim = 2, 3, 5, 192
    seq = frames * height * width
    q = (torch.randn(2, seq, dim) * 3).to(dtype)
    k = (torch.randn(2, seq, dim) + 0.5).to(dtype)
    wq = (1 + 0.2 * torch.randn(dim)).to(dtype)
    wk = (1 + 0.2 * torch.randn(dim)).to(dtype)
    cos, sin = video_reference(2, dim, frames, height, width, (0.32, 32, 32))
    q_ref = ltx_apply_rotary_emb(rms_norm_across_heads(q, wq, 1e-5, dtype), cos, sin)
    k_ref = ltx_apply_rotary_emb(rms_norm_across_heads(k, wk, 1e-5, dtype), cos, sin)
    if video:
        q_out, k_out = kiln.rms_norm_rope(q, k, wq, wk, 1e-5, grid=(frames, height, width),
                                          rope_interpolation_scale=(0.32, 32, 32))
        assert_video_close(q_out, q_ref, dtype, cos, rms_norm_across_heads(q, wq, 1e-5, dtype))
        assert_video_close(k_out, k_ref, dtype, cos, rms_norm_across_heads(k, wk, 1e-5, dtype))
    else:
        q_out, k_out = kiln.rms_norm_rope(q, k, wq, wk, 1e-5, cos.float(), sin.float())
        assert_close_to(q_out, q_ref, dtype)
        assert_close_to(k_out, k_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("table", ["heads axis", "batch", "positions"])
def test_rms_norm_rope_head_tables_match_wan_attention(dtype, table):
    """Wan's q/k norms across heads, then its rotation of each head from [.., S, 1, D] tables,
    given as head_dim / 2 columns (cos at even columns, sin at odd ones); the tables here
    differ at every column, so only those columns give Wan's result."""
    heads, d, s = 3, 12, 7
    q = (torch.randn(2, s, heads * d) * 3).to(dtype)
    k = (torch.randn(2, s, heads * d) + 0.5).to(dtype)
    wq = (1 + 0.2 * torch.randn(heads * d)).to(dtype)
    wk = (1 + 0.2 * torch.randn(heads * d)).to(dtype)
    cos, sin = unrelated_cos_sin(2, s, d)
    q_ref = wan_apply_rotary_emb(rms_norm_across_heads(q, wq, 1e-6, dtype), cos, sin, heads)
    k_ref = wan_apply_rotary_emb(rms_norm_across_heads(k, wk, 1e-6, dtype), cos, sin, heads)
    cos_half, sin_half = cos[..., 0::2], sin[..., 1::2]
    if table == "batch":
        cos_half, sin_half = cos_half.squeeze(2), sin_half.squeeze(2)
    elif table == "positions":
        q, k, q_ref, k_ref = q[:1], k[:1], q_ref[:1], k_ref[:1]
        cos_half, sin_half = cos_half[0, :, 0], sin_half[0, :, 0]
    q_out, k_out = kiln.rms_norm_rope(q, k, wq, wk, 1e-6, cos_half, sin_half, head_dim=d)
    assert_close_to(q_out, q_ref, dtype)
    assert_close_to(k_out, k_ref, dtype)


def test_rms_norm_rope_head_dim_bad_inputs():
    q = torch.randn(1, 5, 24)
    w = torch.ones(24)
    half = torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"kiln\.rms_norm_rope: head_dim: expected -1 or a multiple of 4 "
                                         r"dividing q's width 24, got 5"):
        kiln.rms_norm_rope(q, q, w, w, 1e-6, half, half, head_dim=5)
    with pytest.raises(ValueError, match=r"kiln\.rms_norm_rope: head_dim: expected -1 or a multiple of 4"):
        kiln.rms_norm_rope(q, q, w, w, 1e-6, half, half, head_dim=16)
    # Pairs of angles a vector: a head dim of 6 (3 angles) is refused on every device alike.
    with pytest.raises(ValueError, match=r"kiln\.rms_norm_rope: head_dim: expected -1 or a multiple of 4"):
        kiln.rms_norm_rope(q, q, w, w, 1e-6, torch.randn(5, 3), torch.randn(5, 3), head_dim=6)
    with pytest.raises(ValueError, match=r"kiln\.rms_norm_rope: cos: expected \[S, R\], \[B, S, R\] or \[B, S, 1, R\]"):
        kiln.rms_norm_rope(q, q, w, w, 1e-6, torch.randn(4), torch.randn(4), head_dim=8)
    with pytest.raises(ValueError, match=r"kiln\.rms_norm_rope: cos: expected a last dimension of head_dim / 2 "
                                         r"= 4 \(one angle a rotation pair of each head\), got \[5, 8\]"):
        kiln.rms_norm_rope(q, q, w, w, 1e-6, torch.randn(5, 8), torch.randn(5, 8), head_dim=8)
    with pytest.raises(ValueError, match=r"kiln\.rms_norm_rope: head_dim: expected -1 with a video grid, got 8"):
        kiln.rms_norm_rope(torch.randn(1, 6, 24), torch.randn(1, 6, 24), w, w, grid=(1, 2, 3), head_dim=8)
    with pytest.raises(ValueError, match=r"kiln\.rms_norm_rope: cos: expected a table for 5 positions"):
        kiln.rms_norm_rope(q, q, w, w, 1e-6, torch.randn(6, 4), torch.randn(6, 4), head_dim=8)


# --- bad inputs -------------------------------------------------------------------------

def _qk(d=64, dtype=torch.float32):
    return torch.randn(1, 2, 5, d, dtype=dtype), torch.randn(1, 1, 5, d, dtype=dtype)


def test_odd_head_dim_is_refused():
    q, k = _qk(63)
    with pytest.raises(ValueError, match=r"kiln\.rope: q: expected an even head dim"):
        kiln.rope(q, k, torch.randn(5, 62), torch.randn(5, 62))


def test_table_wider_than_head_or_mismatched():
    q, k = _qk(64)
    with pytest.raises(ValueError, match=r"kiln\.rope: cos: expected an even rotated width"):
        kiln.rope(q, k, torch.randn(5, 128), torch.randn(5, 128))
    with pytest.raises(ValueError, match=r"kiln\.rope: sin: expected shape \[5, 64\] \(as cos\)"):
        kiln.rope(q, k, torch.randn(5, 64), torch.randn(5, 32))
    with pytest.raises(ValueError, match=r"kiln\.rope: cos: expected a table for 5 positions"):
        kiln.rope(q, k, torch.randn(6, 64), torch.randn(6, 64))
    with pytest.raises(ValueError, match=r"kiln\.rope: rotary_dim: expected an even rotated width"):
        kiln.rope(q, k, torch.randn(5, 64), torch.randn(5, 64), rotary_dim=33)
    # A table narrower than rotary_dim is a half table only at exactly rotary_dim / 2.
    with pytest.raises(ValueError, match=r"kiln\.rope: cos: expected a last dimension >= rotary_dim 64, "
                                         r"or 32 \(one angle a rotation pair\), got \[5, 48\]"):
        kiln.rope(q, k, torch.randn(5, 48), torch.randn(5, 48), rotary_dim=64)
    with pytest.raises(ValueError, match=r"kiln\.rope: cos: expected a last dimension >= rotary_dim 64, or 32"):
        kiln.rope(q, k, torch.randn(5, 16), torch.randn(5, 16), rotary_dim=64)


def test_bad_dtypes_and_layouts():
    q, k = _qk()
    with pytest.raises(TypeError, match=r"kiln\.rope: k: expected dtype float32 \(as q\), got bfloat16"):
        kiln.rope(q, k.bfloat16(), torch.randn(5, 64), torch.randn(5, 64))
    with pytest.raises(TypeError, match=r"kiln\.rope: cos: expected dtype float32 or bfloat16"):
        kiln.rope(q.bfloat16(), k.bfloat16(), torch.randn(5, 64).half(), torch.randn(5, 64).half())
    with pytest.raises(TypeError, match=r"kiln\.rope: q: expected dtype float32, float16, bfloat16 or \(on the CPU\) float64, got int32"):
        kiln.rope(q.int(), k.int(), torch.randn(5, 64), torch.randn(5, 64))
    with pytest.raises(ValueError, match=r"kiln\.rope: layout: expected"):
        kiln.rope(q, k, torch.randn(5, 64), torch.randn(5, 64), layout="sbhd")
    with pytest.raises(ValueError, match=r"kiln\.rope: k: expected q's batch, sequence length and head dim"):
        kiln.rope(q, torch.randn(1, 1, 6, 64), torch.randn(5, 64), torch.randn(5, 64))
    with pytest.raises(ValueError, match=r"kiln\.rope: head_dim: expected a divisor"):
        kiln.rope(torch.randn(1, 5, 96), torch.randn(1, 5, 96), torch.randn(5, 64),
                  torch.randn(5, 64), layout="bshd")


def test_mismatched_devices():
    q, k = _qk()
    cos = torch.randn(5, 64, device="meta")
    with pytest.raises(ValueError, match=r"kiln\.rope: cos: expected device cpu \(as q\), got meta"):
        kiln.rope(q, k, cos, torch.randn(5, 64))


def test_video_and_fused_bad_inputs():
    q = torch.randn(1, 12, 60)
    with pytest.raises(ValueError, match=r"kiln\.rope_3d: grid: expected frames \* height \* width"):
        kiln.rope_3d(q, q, 2, 2, 2)
    with pytest.raises(ValueError, match=r"kiln\.rope_3d: q: expected an even width"):
        kiln.rope_3d(torch.randn(1, 12, 61), torch.randn(1, 12, 61), 2, 2, 3)
    w = torch.randn(60)
    with pytest.raises(ValueError, match=r"kiln\.rms_norm_rope: cos: expected either cos and sin or a video grid"):
        kiln.rms_norm_rope(q, q, w, w)
    with pytest.raises(ValueError, match=r"kiln\.rms_norm_rope: q_weight: expected shape \[60\]"):
        kiln.rms_norm_rope(q, q, torch.randn(30), w, grid=(2, 2, 3))
    with pytest.raises(ValueError, match=r"kiln\.rms_norm_rope: cos: expected a last dimension of q's width 60"):
        kiln.rms_norm_rope(q, q, w, w, 1e-5, torch.randn(12, 30), torch.randn(12, 30))


def test_fakes_trace_under_compile():
    q, k = _qk()
    cos, sin = torch.randn(5, 64), torch.randn(5, 64)

    v = torch.randn(1, 60, 12)
    w = torch.randn(12)

    @torch.compile(fullgraph=True, backend="eager")
    def f(q, k, cos, sin, v, w):
        a, b = kiln.rope(q, k, cos, sin)
        c, _ = kiln.rope_3d(v, v, 3, 4, 5, (0.32, 32, 32))
        d, _ = kiln.rms_norm_rope(v, v, w, w, grid=(3, 4, 5))
        return a + 1, b, c, d

    a, b, c, d = f(q, k, cos, sin, v, w)
    assert a.shape == q.shape and b.shape == k.shape and c.shape == d.shape == v.shape
    torch.testing.assert_close(c, kiln.rope_3d(v, v, 3, 4, 5, (0.32, 32, 32))[0])


def test_rms_norm_rope_fake_checks_head_dim_and_tables():
    """Under torch.compile the fake gives the op's own errors for head_dim and the table's width."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(1, 5, 24)
        w = torch.empty(24)
        with pytest.raises(ValueError, match=r"kiln\.rms_norm_rope: head_dim: expected -1 or a multiple of 4 "
                                             r"dividing q's width 24, got 6"):
            torch.ops.kiln.rms_norm_rope(q, q, w, w, 1e-6, torch.empty(5, 3), torch.empty(5, 3), head_dim=6)
        with pytest.raises(ValueError, match=r"kiln\.rms_norm_rope: cos: expected a last dimension of head_dim / 2 "
                                             r"= 4 \(one angle a rotation pair of each head\), got \[5, 8\]"):
            torch.ops.kiln.rms_norm_rope(q, q, w, w, 1e-6, torch.empty(5, 8), torch.empty(5, 8), head_dim=8)
        with pytest.raises(ValueError, match=r"kiln\.rms_norm_rope: cos: expected a last dimension of q's width 24"):
            torch.ops.kiln.rms_norm_rope(q, q, w, w, 1e-6, torch.empty(5, 8), torch.empty(5, 8))
        out, _ = torch.ops.kiln.rms_norm_rope(q, q, w, w, 1e-6, torch.empty(1, 5, 1, 4), torch.empty(1, 5, 1, 4),
                                              head_dim=8)
        assert out.shape == q.shape


def test_the_mla_bench_restates_deepseek_and_checks_kiln_against_it():
    """bench/mla_rope.py's eager peer is transformers' DeepSeek-V3 function (or its restatement,
    the same formula), and each of its cases, run on the CPU, agrees with kiln."""
    from bench_scripts import load_bench

    bench = load_bench("mla_rope")
    q, k = bench.latent_qk(2, 3, 5, device="cpu")
    cos, sin = bench.table(2, 5, device="cpu")
    expected = deepseek_apply_rotary_pos_emb_interleave(q, k, cos, sin)
    for apply in (bench.deepseek_apply_rotary_pos_emb_interleave, bench.interleave_apply()[0]):
        for got, e in zip(apply(q, k, cos, sin), expected):
            assert_close_to(got, e, torch.bfloat16)
    bench.SHAPES = [("tiny", 2, 3, 5, 0), ("decode", 4, 3, 1, 4096)]
    cases = list(bench.cases(quick=False, device="cpu"))
    assert len(cases) == 2
    for case in cases:
        assert case["check"]() < 1e-2
