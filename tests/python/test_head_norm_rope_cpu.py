"""head_norm_rope on the CPU (kiln's reference): each head of q and k RMS-normalised, rounded
to the data's dtype as the models' norm modules round it, then rotated; against fp64
restatements of Qwen3's attention prologue (``q_norm`` on [B, S, H, D], transpose,
``apply_rotary_pos_emb``) and FLUX's (``norm_q`` per head, diffusers' interleaved
``apply_rotary_emb``), with and without weights, partial rotary dims, in place, under
torch.compile, and bad inputs."""

import pytest
import torch

import kiln
from reference import assert_close_to
from rope_reference import flux_prologue, hf_apply_rotary_pos_emb, llama_cos_sin, rms_norm_per_head

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def fresh(*shape, gen, dtype=torch.float32):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def weights(d, gen, dtype, weighted):
    if not weighted:
        return None, None
    return ((1 + 0.3 * fresh(d, gen=gen)).to(dtype), (1 + 0.3 * fresh(d, gen=gen)).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 4, 2, 7, 8), (1, 3, 1, 1, 6), (1, 16, 8, 33, 128)])
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("table_fp32", [True, False])
def test_qwen3_prologue(dtype, shape, weighted, table_fp32):
    """transformers' order: the norms on [B, S, H, D], then [B, H, S, D] views of them rotated."""
    b, hq, hk, s, d = shape
    gen = torch.Generator().manual_seed(hash(shape) % 1000)
    q = fresh(b, s, hq, d, gen=gen, dtype=dtype)
    k = fresh(b, s, hk, d, gen=gen, dtype=dtype)
    wq, wk = weights(d, gen, dtype, weighted)
    cos, sin = llama_cos_sin(b, s, d, positions=torch.randint(0, 4096, (b, s), generator=gen))
    if not table_fp32:
        cos, sin = cos.to(dtype), sin.to(dtype)
    qn = rms_norm_per_head(q, wq, 1e-6, dtype).transpose(1, 2)
    kn = rms_norm_per_head(k, wk, 1e-6, dtype).transpose(1, 2)
    q_ref, k_ref = hf_apply_rotary_pos_emb(qn, kn, cos, sin)
    q_out, k_out = kiln.head_norm_rope(q.transpose(1, 2), k.transpose(1, 2), wq, wk, cos, sin)
    assert q_out.stride() == q.transpose(1, 2).stride()  # laid out as transformers' q
    assert_close_to(q_out, q_ref, dtype)
    assert_close_to(k_out, k_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("flat", [False, True])
def test_flux_prologue(dtype, weighted, flat):
    """diffusers' order: [B, S, H, D] (or [B, S, H * D] with head_dim) normalised per head and
    rotated in interleaved pairs by an fp32 [S, D] table."""
    gen = torch.Generator().manual_seed(11)
    b, s, h, d = 2, 9, 3, 16
    q, k = fresh(b, s, h, d, gen=gen, dtype=dtype), fresh(b, s, h, d, gen=gen, dtype=dtype)
    wq, wk = weights(d, gen, dtype, weighted)
    cos, sin = fresh(s, d, gen=gen), fresh(s, d, gen=gen)
    q_ref, k_ref = flux_prologue(q, wq, cos, sin, 1e-6, dtype), flux_prologue(k, wk, cos, sin, 1e-6, dtype)
    if flat:
        q_out, k_out = kiln.head_norm_rope(q.flatten(2), k.flatten(2), wq, wk, cos, sin,
                                           interleaved=True, layout="bshd", head_dim=d)
        q_out, k_out = q_out.unflatten(2, (h, d)), k_out.unflatten(2, (h, d))
    else:
        q_out, k_out = kiln.head_norm_rope(q, k, wq, wk, cos, sin, interleaved=True, layout="bshd")
    assert_close_to(q_out, q_ref, dtype)
    assert_close_to(k_out, k_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_partial_rotary_normalises_every_column_and_in_place_agrees(dtype):
    """The norm spans the whole head; only the first rotary_dim columns turn, the rest come
    out normalised (in place too)."""
    gen = torch.Generator().manual_seed(3)
    q, k = fresh(2, 4, 5, 32, gen=gen, dtype=dtype), fresh(2, 2, 5, 32, gen=gen, dtype=dtype)
    wq, wk = weights(32, gen, dtype, True)
    cos, sin = llama_cos_sin(2, 5, 16)
    qn, kn = rms_norm_per_head(q, wq, 1e-5, dtype), rms_norm_per_head(k, wk, 1e-5, dtype)
    q_ref, k_ref = hf_apply_rotary_pos_emb(qn, kn, cos, sin)
    q_out, k_out = kiln.head_norm_rope(q, k, wq, wk, cos, sin, eps=1e-5)
    assert_close_to(q_out, q_ref, dtype)
    assert_close_to(k_out, k_ref, dtype)
    assert_close_to(q_out[..., 16:], qn[..., 16:].double(), dtype)  # normalised, not copied
    q2, k2 = q.clone(), k.clone()
    kiln.head_norm_rope_(q2, k2, wq, wk, cos, sin, eps=1e-5)
    assert torch.equal(q2, q_out) and torch.equal(k2, k_out)


def test_float64_is_the_fp64_formula():
    gen = torch.Generator().manual_seed(4)
    q, k = fresh(1, 4, 6, 8, gen=gen, dtype=torch.float64), fresh(1, 2, 6, 8, gen=gen, dtype=torch.float64)
    wq, wk = fresh(8, gen=gen, dtype=torch.float64), fresh(8, gen=gen, dtype=torch.float64)
    cos, sin = llama_cos_sin(1, 6, 8)
    cos, sin = cos.double(), sin.double()
    q_ref, k_ref = hf_apply_rotary_pos_emb(rms_norm_per_head(q, wq, 1e-6, torch.float64),
                                           rms_norm_per_head(k, wk, 1e-6, torch.float64), cos, sin)
    q_out, k_out = kiln.head_norm_rope(q, k, wq, wk, cos, sin)
    torch.testing.assert_close(q_out, q_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k_out, k_ref, rtol=1e-12, atol=1e-12)


def test_torch_compile_traces_it():
    gen = torch.Generator().manual_seed(6)
    q, k = fresh(1, 4, 5, 8, gen=gen), fresh(1, 2, 5, 8, gen=gen)
    w = fresh(8, gen=gen)
    cos, sin = llama_cos_sin(1, 5, 8)
    eager = kiln.head_norm_rope(q, k, w, None, cos, sin)
    compiled = torch.compile(lambda *a: kiln.head_norm_rope(*a), fullgraph=True)(q, k, w, None, cos, sin)
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)
    heads_inner = q.transpose(1, 2).contiguous()
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fq = mode.from_tensor(heads_inner).transpose(1, 2)
        fk = mode.from_tensor(k)
        out_q, out_k = torch.ops.kiln.head_norm_rope(fq, fk, None, None, mode.from_tensor(cos),
                                                     mode.from_tensor(sin))
        assert out_q.shape == fq.shape and out_q.stride() == fq.stride()
        assert out_k.shape == fk.shape


def test_bad_inputs_name_the_op_and_the_argument():
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    cos, sin = torch.randn(5, 8), torch.randn(5, 8)
    w = torch.randn(8)
    with pytest.raises(ValueError, match=r"kiln\.head_norm_rope: q_weight: expected \[8\] \(the head dim\), got \[4\]"):
        kiln.head_norm_rope(q, k, w[:4], w, cos, sin)
    with pytest.raises(ValueError, match=r"kiln\.head_norm_rope: k_weight: expected \[8\] \(the head dim\), got \[1, 8\]"):
        kiln.head_norm_rope(q, k, w, w[None], cos, sin)
    with pytest.raises(TypeError, match=r"kiln\.head_norm_rope: k_weight: expected dtype float32 \(as q\), got bfloat16"):
        kiln.head_norm_rope(q, k, None, w.bfloat16(), cos, sin)
    with pytest.raises(ValueError, match=r"kiln\.head_norm_rope: q_weight: expected device cpu \(as q\), got meta"):
        kiln.head_norm_rope(q, k, w.to("meta"), None, cos, sin)
    with pytest.raises(ValueError, match=r"kiln\.head_norm_rope: k: expected q's batch, sequence length and head dim"):
        kiln.head_norm_rope(q, torch.randn(1, 2, 6, 8), w, w, cos, sin)
    with pytest.raises(ValueError, match=r"kiln\.head_norm_rope: q: expected an even head dim"):
        kiln.head_norm_rope(torch.randn(1, 4, 5, 7), torch.randn(1, 2, 5, 7), None, None,
                            torch.randn(5, 6), torch.randn(5, 6), rotary_dim=6)
    with pytest.raises(ValueError, match=r"kiln\.head_norm_rope_: q_weight: expected \[8\]"):
        kiln.head_norm_rope_(q, k, w[:2], None, cos, sin)


def test_the_bench_restates_the_libraries_prologues():
    """bench/head_norm_rope.py's eager peers are the libraries' own norms (transformers'
    Qwen3RMSNorm, diffusers' RMSNorm) and rotations, and kiln's CPU op agrees with them."""
    pytest.importorskip("diffusers", reason="diffusers is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")
    from bench_scripts import load_bench
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.normalization import RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    bench = load_bench("head_norm_rope")
    gen = torch.Generator().manual_seed(9)
    x = fresh(2, 7, 3, 16, gen=gen, dtype=torch.bfloat16)
    w = (1 + 0.3 * fresh(16, gen=gen)).to(torch.bfloat16)
    qwen3, flux = Qwen3RMSNorm(16, eps=1e-6).bfloat16(), RMSNorm(16, eps=1e-6).bfloat16()
    with torch.no_grad():
        qwen3.weight.copy_(w)
        flux.weight.copy_(w)
        assert torch.equal(bench.qwen3_rms_norm(w)(x), qwen3(x))
        assert torch.equal(bench.diffusers_rms_norm(w)(x), flux(x))
        cos, sin = fresh(7, 16, gen=gen), fresh(7, 16, gen=gen)
        expected = apply_rotary_emb(flux(x), (cos, sin), use_real_unbind_dim=-1, sequence_dim=1)
        assert torch.equal(bench.flux_apply_rotary_emb(flux(x), cos, sin), expected)
        got, _ = kiln.head_norm_rope(x, x, w, w, cos, sin, interleaved=True, layout="bshd")
        assert_close_to(got, flux_prologue(x, w, cos, sin, 1e-6, torch.bfloat16), torch.bfloat16)


def test_the_bench_restates_qwen3_next_prologue():
    """bench/head_norm_rope.py's Qwen3-Next peer: its norm is transformers' Qwen3NextRMSNorm
    (Gemma's 1 + weight), its rotation transformers' partial one (the local restatement agrees
    with it), and kiln's CPU op, given 1 + weight, agrees with the prologue."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next",
                                   reason="transformers has no Qwen3-Next")
    from bench_scripts import load_bench

    bench = load_bench("head_norm_rope")
    gen = torch.Generator().manual_seed(10)
    q = fresh(2, 7, 3, 16, gen=gen, dtype=torch.bfloat16)
    k = fresh(2, 7, 1, 16, gen=gen, dtype=torch.bfloat16)
    w = (0.3 * fresh(16, gen=gen)).to(torch.bfloat16)
    norm = modeling.Qwen3NextRMSNorm(16, eps=1e-6).bfloat16()
    angles = 20 * torch.rand(2, 7, 2, generator=gen)
    cos, sin = (f(torch.cat((angles, angles), -1)).to(torch.bfloat16) for f in (torch.cos, torch.sin))
    apply, source = bench.partial_apply()
    assert source == "transformers"
    with torch.no_grad():
        norm.weight.copy_(w)
        assert torch.equal(bench.gemma_rms_norm(w)(q), norm(q))
        q_t, k_t = norm(q).transpose(1, 2), norm(k).transpose(1, 2)
        expected = apply(q_t, k_t, cos, sin)
        rotated = modeling.apply_rotary_pos_emb(q_t, k_t, cos, sin)
        assert all(torch.equal(e, r) for e, r in zip(expected, rotated))
        offset = (1 + w.float()).to(torch.bfloat16)
        got = kiln.head_norm_rope(q.transpose(1, 2), k.transpose(1, 2), offset, offset, cos, sin)
    for g, e in zip(got, expected):
        assert_close_to(g, e.double(), torch.bfloat16)
