"""The RoPE ops on the GPU against the fp64 formulas, on the issue's grid and odd shapes,
output memory poisoned first; plus the in-place form, tuning and mixed devices."""

import pytest
import torch

import kiln
from reference import assert_close_to
from rope_reference import (deepseek_apply_rotary_pos_emb_interleave, diffusers_apply_rotary_emb,
                            gpt_oss_apply_rotary_pos_emb,
                            hf_apply_rotary_pos_emb, llama_cos_sin, ltx_apply_rotary_emb,
                            ltx_video_table, rms_norm_across_heads, transformers_qk,
                            assert_norm_rope_close, unrelated_cos_sin, wan_apply_rotary_emb)
from test_rope_cpu import assert_video_close, gpt_oss_cos_sin, mla_qk, video_reference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("heuristic_tuning")]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def poison(shape, dtype):
    junk = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    del junk


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 32, 8, 4096, 128), (2, 32, 8, 33, 128), (1, 32, 8, 1, 128),
                                   (3, 5, 1, 17, 64), (1, 4, 4, 7, 80)])
@pytest.mark.parametrize("table_fp32", [True, False])
def test_half_split_grid(dtype, shape, table_fp32):
    b, hq, hk, s, d = shape
    q = torch.randn(b, hq, s, d, device="cuda").to(dtype)
    k = torch.randn(b, hk, s, d, device="cuda").to(dtype)
    cos, sin = llama_cos_sin(b, s, d, positions=torch.randint(0, 8192, (b, s)))
    cos, sin = cos.cuda(), sin.cuda()
    if not table_fp32:
        cos, sin = cos.to(dtype), sin.to(dtype)
    poison(q.shape, dtype)
    q_out, k_out = kiln.rope(q, k, cos, sin)
    q_ref, k_ref = hf_apply_rotary_pos_emb(q, k, cos, sin)
    assert_close_to(q_out, q_ref, dtype)
    assert_close_to(k_out, k_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64, 8, 4096, 64), (2, 5, 1, 17, 128), (3, 64, 8, 1, 64),
                                   (1, 4, 4, 7, 80)])
@pytest.mark.parametrize("table_fp32", [True, False])
@pytest.mark.parametrize("heads_inner", [False, True])
def test_half_table_grid(dtype, shape, table_fp32, heads_inner):
    """GPT-OSS's [B, S, D / 2] tables (64 + 8 heads of 64 at 4096 tokens, a decode batch,
    odd head counts and a head dim of 80), on q and k as transformers hands them over and
    contiguous."""
    b, hq, hk, s, d = shape
    q, k = transformers_qk(b, hq, hk, s, d, dtype, heads_inner)
    cos, sin = gpt_oss_cos_sin(b, s, d, torch.float32 if table_fp32 else dtype)
    cos, sin = cos.cuda(), sin.cuda()
    poison(q.shape, dtype)
    q_out, k_out = kiln.rope(q, k, cos, sin, rotary_dim=d)
    q_ref, k_ref = gpt_oss_apply_rotary_pos_emb(q, k, cos, sin)
    assert_close_to(q_out, q_ref, dtype)
    assert_close_to(k_out, k_ref, dtype)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [128, 64])
def test_half_table_gives_the_full_tables_bits(interleaved, rotary_dim):
    """Each angle once or twice in the table, the same rotation to the bit, forward, backward
    and in place, and a transformers table cut to its first half read through its strides."""
    q = torch.randn(2, 32, 37, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 8, 37, 128, device="cuda", dtype=torch.bfloat16)
    angles = torch.rand(37, rotary_dim // 2, device="cuda") * 50
    half_cos, half_sin = angles.cos(), angles.sin()
    full = (lambda t: t.repeat_interleave(2, -1)) if interleaved else (lambda t: torch.cat((t, t), -1))
    expected = kiln.rope(q, k, full(half_cos), full(half_sin), interleaved)
    poison(q.shape, torch.bfloat16)
    got = kiln.rope(q, k, half_cos, half_sin, interleaved, rotary_dim=rotary_dim)
    for e, g in zip(expected, got):
        assert torch.equal(g, e)
    back = torch.ops.kiln.rope_backward(q, k, half_cos, half_sin, interleaved, rotary_dim)
    back_full = torch.ops.kiln.rope_backward(q, k, full(half_cos), full(half_sin), interleaved)
    for e, g in zip(back_full, back):
        assert torch.equal(g, e)
    q2, k2 = q.clone(), k.clone()
    kiln.rope_(q2, k2, half_cos, half_sin, interleaved, rotary_dim=rotary_dim)
    assert torch.equal(q2, expected[0]) and torch.equal(k2, expected[1])
    if not interleaved and rotary_dim == 128:
        cos, sin = llama_cos_sin(1, 37, 128)
        cos, sin = cos.cuda().bfloat16(), sin.cuda().bfloat16()
        expected = kiln.rope(q, k, cos, sin)
        got = kiln.rope(q, k, cos[..., :64], sin[..., :64], rotary_dim=128)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 24, 4608, 128), (2, 3, 31, 64), (1, 2, 5, 6)])
def test_interleaved_flux_like(dtype, shape):
    b, h, s, d = shape
    q = torch.randn(b, h, s, d, device="cuda").to(dtype)
    k = torch.randn(b, h, s, d, device="cuda").to(dtype)
    cos, sin = torch.randn(s, d, device="cuda"), torch.randn(s, d, device="cuda")
    poison(q.shape, dtype)
    q_out, k_out = kiln.rope(q, k, cos, sin, interleaved=True)
    assert_close_to(q_out, diffusers_apply_rotary_emb(q, cos, sin), dtype)
    assert_close_to(k_out, diffusers_apply_rotary_emb(k, cos, sin), dtype)
    q3, _ = kiln.rope(q.transpose(1, 2).flatten(2), k.transpose(1, 2).flatten(2), cos, sin,
                      interleaved=True, layout="bshd")
    assert_close_to(q3, diffusers_apply_rotary_emb(q, cos, sin).transpose(1, 2).flatten(2), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotary_dim", [32, 64, 78])  # 78: MiniMax-M3-VL's, halves of 39 columns
def test_partial_and_in_place(dtype, rotary_dim):
    q = torch.randn(2, 8, 37, 128, device="cuda").to(dtype)
    k = torch.randn(2, 2, 37, 128, device="cuda").to(dtype)
    cos, sin = llama_cos_sin(2, 37, rotary_dim)
    cos, sin = cos.cuda(), sin.cuda()
    q_ref, k_ref = hf_apply_rotary_pos_emb(q, k, cos, sin)
    q_out, k_out = kiln.rope(q, k, cos, sin)
    assert_close_to(q_out, q_ref, dtype)
    assert_close_to(k_out, k_ref, dtype)
    q2, k2 = q.clone(), k.clone()
    kiln.rope_(q2, k2, cos, sin)
    assert torch.equal(q2, q_out) and torch.equal(k2, k_out)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("frames,height,width,dim", [(7, 16, 24, 2048), (3, 5, 7, 96), (2, 3, 4, 100)])
def test_ltx_table_rope_3d_and_fused(dtype, frames, height, width, dim):
    s = frames * height * width
    scale = (0.32, 32, 32)
    cos, sin = video_reference(2, dim, frames, height, width, scale)
    q = torch.randn(2, s, dim, device="cuda").to(dtype)
    k = torch.randn(2, s, dim, device="cuda").to(dtype)
    q_ref = ltx_apply_rotary_emb(q, cos.cuda(), sin.cuda())
    k_ref = ltx_apply_rotary_emb(k, cos.cuda(), sin.cuda())
    # The table form (diffusers' fp32 table passed in).
    q_t, k_t = kiln.rope(q, k, cos.float().cuda(), sin.float().cuda(), interleaved=True, layout="bshd")
    assert_close_to(q_t, q_ref, dtype)
    assert_close_to(k_t, k_ref, dtype)
    # Angles from coordinates.
    poison(q.shape, dtype)
    q_v, k_v = kiln.rope_3d(q, k, frames, height, width, scale)
    assert_video_close(q_v.cpu(), q_ref.cpu(), dtype, cos, q.cpu())
    assert_video_close(k_v.cpu(), k_ref.cpu(), dtype, cos, k.cpu())
    # Fused with the norm, from the table and from coordinates.
    wq = (1 + 0.2 * torch.randn(dim, device="cuda")).to(dtype)
    wk = (1 + 0.2 * torch.randn(dim, device="cuda")).to(dtype)
    qn, kn = rms_norm_across_heads(q, wq, 1e-5, dtype), rms_norm_across_heads(k, wk, 1e-5, dtype)
    qn_ref = ltx_apply_rotary_emb(qn, cos.cuda(), sin.cuda())
    kn_ref = ltx_apply_rotary_emb(kn, cos.cuda(), sin.cuda())
    q_f, k_f = kiln.rms_norm_rope(q, k, wq, wk, 1e-5, cos.float().cuda(), sin.float().cuda())
    # One extra rounding (the norm's output) sits inside the reference too; allow two.
    tol_dtype = dtype
    assert_close_to(q_f, qn_ref, tol_dtype)
    assert_close_to(k_f, kn_ref, tol_dtype)
    q_fv, k_fv = kiln.rms_norm_rope(q, k, wq, wk, 1e-5, grid=(frames, height, width),
                                    rope_interpolation_scale=scale)
    assert_video_close(q_fv.cpu(), qn_ref.cpu(), dtype, cos, qn.cpu())
    assert_video_close(k_fv.cpu(), kn_ref.cpu(), dtype, cos, kn.cpu())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,seq,heads,d", [(1, 1560, 40, 128), (2, 333, 12, 128), (1, 1, 12, 128),
                                               (3, 17, 5, 80), (2, 9, 6, 12)])
@pytest.mark.parametrize("table_fp32", [True, False])
def test_wan_rms_norm_rope_grid(dtype, batch, seq, heads, d, table_fp32):
    """Wan's prologue (Wan 2.1 14B's 40 heads and 1.3B's 12 heads of 128, one token, odd head
    counts and sequence lengths, head dims of 80 and 12): the norms across heads and each
    head's rotation from head_dim / 2 columns of tables that differ at every column, against
    the fp64 formula, output memory poisoned first."""
    q = (torch.randn(batch, seq, heads * d, device="cuda") * 3).to(dtype)
    k = (torch.randn(batch, seq, heads * d, device="cuda") + 0.5).to(dtype)
    wq = (1 + 0.2 * torch.randn(heads * d, device="cuda")).to(dtype)
    wk = (1 + 0.2 * torch.randn(heads * d, device="cuda")).to(dtype)
    cos, sin = unrelated_cos_sin(1, seq, d, device="cuda")
    if not table_fp32:
        cos, sin = cos.to(dtype), sin.to(dtype)
    qn, kn = rms_norm_across_heads(q, wq, 1e-6, dtype), rms_norm_across_heads(k, wk, 1e-6, dtype)
    q_ref = wan_apply_rotary_emb(qn, cos, sin, heads)
    k_ref = wan_apply_rotary_emb(kn, cos, sin, heads)
    poison(q.shape, dtype)
    q_out, k_out = kiln.rms_norm_rope(q, k, wq, wk, 1e-6, cos[..., 0::2], sin[..., 1::2], head_dim=d)
    assert_norm_rope_close(q_out, q_ref, qn, dtype)
    assert_norm_rope_close(k_out, k_ref, kn, dtype)
    cpu = kiln.rms_norm_rope(q.cpu(), k.cpu(), wq.cpu(), wk.cpu(), 1e-6, cos[..., 0::2].cpu(),
                             sin[..., 1::2].cpu(), head_dim=d)
    assert_norm_rope_close(q_out.cpu(), cpu[0].double(), qn.cpu(), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 128, 4096, 64), (8, 128, 1, 64), (2, 20, 33, 64), (1, 5, 17, 32)])
@pytest.mark.parametrize("half_table", [True, False])
def test_deinterleave_mla_grid(dtype, shape, half_table):
    """DeepSeek-V3's MLA RoPE (apply_rotary_pos_emb_interleave) on the q_rot and k_rot views
    its attention hands over (128 q heads and one k head at 4096 tokens, a decode batch, GLM-4.7-
    Flash's 20 heads, odd sizes), from its table in the model's dtype or the first half of it;
    the backward against fp64 autograd of the formula."""
    b, hq, s, d = shape
    q, k = (t.cuda() for t in mla_qk(b, hq, s, d, dtype))
    cos, sin = llama_cos_sin(b, s, d, positions=torch.randint(0, 8192, (b, s)))
    cos, sin = cos.cuda().to(dtype), sin.cuda().to(dtype)
    table = (cos[..., :d // 2], sin[..., :d // 2]) if half_table else (cos, sin)
    poison((b, hq, s, d), dtype)
    q_out, k_out = kiln.rope(q, k, *table, rotary_dim=d, deinterleave=True)
    q_ref, k_ref = deepseek_apply_rotary_pos_emb_interleave(q, k, cos, sin)
    assert_close_to(q_out, q_ref, dtype)
    assert_close_to(k_out, k_ref, dtype)
    dq, dk = torch.randn_like(q_out), torch.randn_like(k_out)
    poison((b, hq, s, d), dtype)
    got = torch.ops.kiln.rope_backward(dq, dk, *table, False, d, "bhsd", -1, True)
    q64, k64 = q.double().requires_grad_(), k.double().requires_grad_()
    expected = torch.autograd.grad(deepseek_apply_rotary_pos_emb_interleave(q64, k64, cos, sin), (q64, k64),
                                   (dq.double(), dk.double()))
    for g, e in zip(got, expected):
        assert_close_to(g, e, dtype)


def test_tuned_kernels_agree_with_the_heuristic():
    kiln.configure(tune="fast")
    try:
        q = torch.randn(1, 32, 512, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 8, 512, 128, device="cuda", dtype=torch.bfloat16)
        cos, sin = llama_cos_sin(1, 512, 128)
        q_out, k_out = kiln.rope(q, k, cos.cuda(), sin.cuda())
        q_ref, k_ref = hf_apply_rotary_pos_emb(q, k, cos.cuda(), sin.cuda())
        assert_close_to(q_out, q_ref, torch.bfloat16)
        assert_close_to(k_out, k_ref, torch.bfloat16)
        v = torch.randn(2, 7 * 16 * 24, 2048, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(2048, device="cuda", dtype=torch.bfloat16)
        a, _ = kiln.rope_3d(v, v, 7, 16, 24, (0.32, 32, 32))
        b, _ = kiln.rms_norm_rope(v, v, w, w, grid=(7, 16, 24), rope_interpolation_scale=(0.32, 32, 32))
        assert not torch.isnan(a).any() and not torch.isnan(b).any()
        # Wan's: 40 heads of 128, each head's pairs from an fp32 table (tuned, against fp64).
        x = torch.randn(1, 2048, 5120, device="cuda", dtype=torch.bfloat16)
        wx = (1 + 0.2 * torch.randn(5120, device="cuda")).bfloat16()
        cos, sin = unrelated_cos_sin(1, 2048, 128, device="cuda")
        wan_q, _ = kiln.rms_norm_rope(x, x, wx, wx, 1e-6, cos[..., 0::2], sin[..., 1::2], head_dim=128)
        xn = rms_norm_across_heads(x, wx, 1e-6, torch.bfloat16)
        assert_norm_rope_close(wan_q, wan_apply_rotary_emb(xn, cos, sin, 40), xn, torch.bfloat16)
        # DeepSeek-V3's MLA RoPE, de-interleaved from the first half of its bf16 table.
        q, k = (t.cuda() for t in mla_qk(1, 128, 512, 64, torch.bfloat16))
        cos, sin = (t.cuda().bfloat16() for t in llama_cos_sin(1, 512, 64))
        got = kiln.rope(q, k, cos[..., :32], sin[..., :32], rotary_dim=64, deinterleave=True)
        for g, e in zip(got, deepseek_apply_rotary_pos_emb_interleave(q, k, cos, sin)):
            assert_close_to(g, e, torch.bfloat16)
        assert kiln.stats()["tunes"] >= 1
    finally:
        kiln.configure(tune="off")


def test_mixed_devices_are_refused():
    q = torch.randn(1, 2, 5, 64, device="cuda")
    with pytest.raises(ValueError, match=r"kiln\.rope: cos: expected device cuda:0 \(as q\), got cpu"):
        kiln.rope(q, q, torch.randn(5, 64), torch.randn(5, 64, device="cuda"))
