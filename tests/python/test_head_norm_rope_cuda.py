"""head_norm_rope on the GPU against fp64 restatements of the models' prologues (the per-head
norm in fp64 rounded to the data's dtype, as the norm modules hand it on, then the RoPE
formula in fp64), outputs poisoned first: Qwen3's shapes in transformers' layout, FLUX's
interleaved [B, S, H, D], decode, odd head counts and head dims, with and without weights;
in place; partial rotary dims; and every config of a full tune, pinned in turn."""

import pytest
import torch

import kiln
from pinned_tune import run_child
from reference import TOLERANCE, assert_close_to
from rope_reference import (flux_prologue, hf_apply_rotary_pos_emb, llama_cos_sin, rms_norm_per_head,
                            transformers_qk)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("heuristic_tuning")]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def poison():
    torch.cuda.synchronize()
    junk = torch.full((8 << 20,), float("nan"), device="cuda")
    del junk


def assert_close_after_rounded_norm(out, ref, normed, dtype):
    """assert_close_to, plus what the op's first rounding may carry. The normalised head is
    rounded to the data's dtype before the rotation, as the norm module's output is; where the
    exact value lies next to a rounding boundary, the kernel's fp32 normalisation may round it
    the other way from the fp64 reference: one ulp of the head's largest normalised value
    (``normed``, the reference's, shaped as ``out``), which the rotation (|cos| + |sin| <= 1.5)
    carries into the output. In fp16 that ulp alone passes assert_close_to's bound for heads
    whose values reach 2."""
    assert out.shape == ref.shape == normed.shape, (out.shape, ref.shape, normed.shape)
    if dtype == torch.float32:
        assert_close_to(out, ref, dtype)
        return
    assert not torch.isnan(out).any(), "output has NaN (unwritten or poisoned elements)"
    _, exponent = torch.frexp(normed.double().abs().amax(-1, keepdim=True))
    ulp = torch.finfo(dtype).eps * torch.pow(2.0, exponent.double() - 1)
    scale = ref.abs().clamp_min(1.0)
    excess = ((out.double() - ref).abs() - 1.5 * ulp) / scale
    worst = excess.max().item()
    assert worst <= TOLERANCE[dtype], \
        f"max relative error beyond the norm's rounding {worst:.3e} > {TOLERANCE[dtype]:.1e}"


def weights(d, dtype, weighted):
    if not weighted:
        return None, None
    return tuple((1 + 0.3 * torch.randn(d, device="cuda")).to(dtype) for _ in range(2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 32, 8, 4096, 128), (2, 16, 8, 33, 128), (64, 32, 8, 1, 128),
                                   (3, 5, 1, 17, 64), (1, 4, 4, 7, 80), (2, 3, 3, 5, 6)])
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("heads_inner", [True, False])
def test_qwen3_prologue_grid(dtype, shape, weighted, heads_inner):
    """Qwen3-8B's prefill and a decode batch of 64, odd head counts and head dims; q and k as
    transformers hands them over ([B, S, H, D] memory viewed as [B, H, S, D]) and contiguous."""
    b, hq, hk, s, d = shape
    q, k = transformers_qk(b, hq, hk, s, d, dtype, heads_inner)
    wq, wk = weights(d, dtype, weighted)
    cos, sin = llama_cos_sin(b, s, d, base=1e6, positions=torch.randint(0, 32768, (b, s)))
    cos, sin = cos.cuda().to(dtype), sin.cuda().to(dtype)
    q_normed, k_normed = rms_norm_per_head(q, wq, 1e-6, dtype), rms_norm_per_head(k, wk, 1e-6, dtype)
    q_ref, k_ref = hf_apply_rotary_pos_emb(q_normed, k_normed, cos, sin)
    poison()
    q_out, k_out = kiln.head_norm_rope(q, k, wq, wk, cos, sin)
    assert q_out.stride() == q.stride()
    assert_close_after_rounded_norm(q_out, q_ref, q_normed, dtype)
    assert_close_after_rounded_norm(k_out, k_ref, k_normed, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 4608, 24, 128), (2, 31, 3, 64), (1, 5, 2, 6)])
@pytest.mark.parametrize("flat", [False, True])
def test_flux_prologue(dtype, shape, flat):
    """FLUX's attention: q and k [B, S, H, D] (or [B, S, H * D] with head_dim) normalised per
    head, rotated in interleaved pairs by an fp32 [S, D] table."""
    b, s, h, d = shape
    q = torch.randn(b, s, h, d, device="cuda").to(dtype)
    k = torch.randn(b, s, h, d, device="cuda").to(dtype)
    wq, wk = weights(d, dtype, True)
    angles = torch.rand(s, d // 2, device="cuda") * 100
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    q_ref, k_ref = flux_prologue(q, wq, cos, sin, 1e-6, dtype), flux_prologue(k, wk, cos, sin, 1e-6, dtype)
    poison()
    if flat:
        q_out, k_out = kiln.head_norm_rope(q.flatten(2), k.flatten(2), wq, wk, cos, sin,
                                           interleaved=True, layout="bshd", head_dim=d)
        q_out, k_out = q_out.unflatten(2, (h, d)), k_out.unflatten(2, (h, d))
    else:
        q_out, k_out = kiln.head_norm_rope(q, k, wq, wk, cos, sin, interleaved=True, layout="bshd")
    assert_close_after_rounded_norm(q_out, q_ref, rms_norm_per_head(q, wq, 1e-6, dtype), dtype)
    assert_close_after_rounded_norm(k_out, k_ref, rms_norm_per_head(k, wk, 1e-6, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotary_dim", [32, 64, 128])
def test_partial_rotary_and_in_place(dtype, rotary_dim):
    """The norm spans the whole head, the unrotated columns come out normalised, and the
    in-place form writes what the out-of-place one returns, every column of it."""
    q = torch.randn(2, 8, 37, 128, device="cuda").to(dtype)
    k = torch.randn(2, 2, 37, 128, device="cuda").to(dtype)
    wq, wk = weights(128, dtype, True)
    cos, sin = llama_cos_sin(2, 37, rotary_dim)
    cos, sin = cos.cuda(), sin.cuda()
    q_normed, k_normed = rms_norm_per_head(q, wq, 1e-5, dtype), rms_norm_per_head(k, wk, 1e-5, dtype)
    q_ref, k_ref = hf_apply_rotary_pos_emb(q_normed, k_normed, cos, sin)
    poison()
    q_out, k_out = kiln.head_norm_rope(q, k, wq, wk, cos, sin, eps=1e-5)
    assert_close_after_rounded_norm(q_out, q_ref, q_normed, dtype)
    assert_close_after_rounded_norm(k_out, k_ref, k_normed, dtype)
    q2, k2 = q.clone(), k.clone()
    kiln.head_norm_rope_(q2, k2, wq, wk, cos, sin, eps=1e-5)
    assert torch.equal(q2, q_out) and torch.equal(k2, k_out)


def test_matches_the_cpu_reference_and_the_two_step_path():
    """The kernel against kiln's CPU reference, and against kiln.rms_norm then kiln.rope (the
    path a patched model took before): the same rounding, so within an ulp of the data."""
    q = torch.randn(1, 32, 300, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8, 300, 128, device="cuda", dtype=torch.bfloat16)
    wq, wk = weights(128, torch.bfloat16, True)
    cos, sin = llama_cos_sin(1, 300, 128)
    cos, sin = cos.cuda().bfloat16(), sin.cuda().bfloat16()
    got = kiln.head_norm_rope(q, k, wq, wk, cos, sin)
    cpu = kiln.head_norm_rope(q.cpu(), k.cpu(), wq.cpu(), wk.cpu(), cos.cpu(), sin.cpu())
    two_step = kiln.rope(kiln.rms_norm(q, wq, 1e-6), kiln.rms_norm(k, wk, 1e-6), cos, sin)
    for g, c, t in zip(got, cpu, two_step):
        torch.testing.assert_close(g.cpu(), c, rtol=1.6e-2, atol=1.6e-2)
        torch.testing.assert_close(g, t, rtol=1.6e-2, atol=1.6e-2)
        assert (g.float() - t.float()).abs().gt(0).float().mean() < 0.01  # ulp flips only


def test_mixed_devices_are_refused():
    q = torch.randn(1, 2, 5, 64, device="cuda")
    cos = torch.randn(5, 64, device="cuda")
    with pytest.raises(ValueError, match=r"kiln\.head_norm_rope: q_weight: expected device cuda:0 \(as q\), got cpu"):
        kiln.head_norm_rope(q, q, torch.ones(64), None, cos, cos)


CHILD = r"""
import pathlib
import sys
import torch
import kiln
from pinned_tune import check_every_pinned_config
from reference import assert_close_to
from rope_reference import (flux_prologue, hf_apply_rotary_pos_emb, llama_cos_sin, rms_norm_per_head,
                            transformers_qk)

cache = pathlib.Path(sys.argv[1])
gen = torch.Generator(device="cuda").manual_seed(7)

def poison():
    torch.cuda.synchronize()
    junk = torch.full((4 << 20,), float("nan"), device="cuda")
    del junk

def half_split(heads_inner, heads_q, heads_k, weighted=True):
    # 2 x 33 tokens: every config's last CTA partial. Heads inner: transformers' views.
    q, k = transformers_qk(2, heads_q, heads_k, 33, 64, torch.bfloat16, heads_inner, generator=gen)
    w = [(1 + 0.3 * torch.randn(64, device="cuda", generator=gen)).bfloat16() if weighted else None
         for _ in range(2)]
    cos, sin = llama_cos_sin(2, 33, 64, positions=torch.randint(0, 4096, (2, 33)))
    cos, sin = cos.cuda().bfloat16(), sin.cuda().bfloat16()
    q_ref, k_ref = hf_apply_rotary_pos_emb(rms_norm_per_head(q, w[0], 1e-6, torch.bfloat16),
                                           rms_norm_per_head(k, w[1], 1e-6, torch.bfloat16), cos, sin)
    def check():
        poison()
        q_out, k_out = kiln.head_norm_rope(q, k, w[0], w[1], cos, sin)
        assert_close_to(q_out, q_ref, torch.bfloat16)
        assert_close_to(k_out, k_ref, torch.bfloat16)
    return check

def interleaved():
    # FLUX's form in fp16: [3, 21, 4, 128], an fp32 table.
    q = torch.randn(3, 21, 4, 128, device="cuda", generator=gen).half()
    k = torch.randn(3, 21, 4, 128, device="cuda", generator=gen).half()
    w = [(1 + 0.3 * torch.randn(128, device="cuda", generator=gen)).half() for _ in range(2)]
    cos = torch.randn(21, 128, device="cuda", generator=gen)
    sin = torch.randn(21, 128, device="cuda", generator=gen)
    q_ref = flux_prologue(q, w[0], cos, sin, 1e-6, torch.float16)
    k_ref = flux_prologue(k, w[1], cos, sin, 1e-6, torch.float16)
    def check():
        poison()
        q_out, k_out = kiln.head_norm_rope(q, k, w[0], w[1], cos, sin, interleaved=True, layout="bshd")
        assert_close_to(q_out, q_ref, torch.float16)
        assert_close_to(k_out, k_ref, torch.float16)
    return check

# By the problem's flags (256 = head norm): + 48 both head counts multiples of 4, + 16 even,
# + 8 positions inner, + 1 interleaved + 2 fp32 table.
checks = {"f304": half_split(True, 8, 4), "f280": half_split(False, 6, 2, weighted=False),
          "f256": half_split(True, 5, 3), "f307": interleaved()}
for check in checks.values():
    check()  # tunes its problem in full, every candidate checked by the tuner
print("ok", check_every_pinned_config(cache, checks))
"""


def test_every_config_of_a_full_tune_is_correct(tmp_path):
    run_child(CHILD, [str(tmp_path)], tmp_path, "full")
