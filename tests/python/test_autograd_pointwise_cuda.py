"""The backward kernels of rope, swiglu, geglu and gelu on the GPU against autograd of the
fp64 formulas, on fresh random inputs with the output memory poisoned (NaN) first: fp32,
fp16 and bf16, odd and even widths, 1 row and many, every input form; tuned kernels; and
loss.backward() through a small module, eager and compiled."""

import pytest
import torch

import kiln
from activation_reference import bias_gelu_fp64, fresh, geglu_fp64, swiglu_fp64
from reference import assert_close_to
from rope_reference import diffusers_apply_rotary_emb, hf_apply_rotary_pos_emb
from pointwise_block import TinyBlock

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("heuristic_tuning")]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (rows, width): one row, odd widths (the flat tail, narrow vectors), many rows; the bias
# reduction's row groups hold 1 row (5 rows), ~5 rows (300) and 16 rows (2000) each.
SHAPES = [(1, 37), (5, 256), (300, 1000), (2000, 4545)]


def poison(*shapes_and_dtypes):
    """Leaves NaN in the caching allocator's free blocks the op's outputs will reuse, so an
    element the kernel fails to write shows up as NaN."""
    junk = [torch.full(s, float("nan"), dtype=d, device="cuda") for s, d in shapes_and_dtypes]
    del junk


def assert_grad_close(got, want, dtype, summed_rows=1):
    """A gradient summed over rows (dbias) is compared relative to its own scale."""
    if summed_rows > 1:
        scale = max(1.0, want.abs().max().item())
        got, want = got / scale, want / scale
    assert_close_to(got, want, dtype)


def activation_case(op, form, rows, width, dtype, gen):
    def r(*shape, scale=2.0):
        return fresh(shape, dtype, device="cuda", scale=scale, generator=gen)

    approximate = "none" if "erf" in form else "tanh"
    if op == "gelu":
        x = r(rows, width)
        bias = r(width, scale=0.5) if "bias" in form else None
        leaves = [t.double().requires_grad_() for t in (x, bias) if t is not None]
        ref = bias_gelu_fp64(leaves[0], leaves[1] if bias is not None else None, approximate)
        dy = r(*ref.shape)
        poison(((rows, width), dtype), ((width,), dtype))
        got = torch.ops.kiln.gelu_backward(dy, x, bias, approximate)
    else:
        packed = "packed" in form
        up_first = "up_first" in form
        gate = r(rows, 2 * width) if packed else r(rows, width)
        up = None if packed else r(rows, width)
        leaves = [t.double().requires_grad_() for t in (gate, up) if t is not None]
        up_leaf = None if packed else leaves[1]
        if op == "swiglu":
            ref = swiglu_fp64(leaves[0], up_leaf, up_first)
        else:
            ref = geglu_fp64(leaves[0], up_leaf, approximate, up_first)
        dy = r(*ref.shape)
        poison((gate.shape, dtype), ((rows, width), dtype))
        if op == "swiglu":
            got = torch.ops.kiln.swiglu_backward(dy, gate, up, up_first)
        else:
            got = torch.ops.kiln.geglu_backward(dy, gate, up, approximate, up_first)
    want = torch.autograd.grad(ref, leaves, dy.double())
    return got, want


FORMS = [("swiglu", "separate"), ("swiglu", "packed"), ("swiglu", "packed up_first"),
         ("geglu", "separate"), ("geglu", "erf packed"), ("geglu", "erf packed up_first"),
         ("gelu", "plain"), ("gelu", "erf"), ("gelu", "bias"), ("gelu", "erf bias")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op,form", FORMS)
def test_activation_backward_kernels(op, form, dtype):
    gen = torch.Generator(device="cuda").manual_seed(5)
    for rows, width in SHAPES:
        got, want = activation_case(op, form, rows, width, dtype, gen)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.is_cuda and g.dtype == dtype and g.is_contiguous()
            assert_grad_close(g, w, dtype, summed_rows=rows if g.dim() == 1 else 1)


def test_activation_backward_strided_inputs():
    gen = torch.Generator(device="cuda").manual_seed(9)
    base = fresh((64, 520), torch.bfloat16, "cuda", generator=gen)
    gate = base[:, 1:257]  # 2-byte aligned rows, 520 apart
    up = fresh((256, 64), torch.bfloat16, "cuda", generator=gen).t()  # copied: no row stride
    dy = fresh((64, 256), torch.bfloat16, "cuda", generator=gen)
    leaves = [gate.double().requires_grad_(), up.double().requires_grad_()]
    want = torch.autograd.grad(swiglu_fp64(*leaves), leaves, dy.double())
    got = torch.ops.kiln.swiglu_backward(dy, gate, up)
    for g, w in zip(got, want):
        assert_close_to(g, w, torch.bfloat16)
    x = fresh((8, 6, 512), torch.float16, "cuda", generator=gen).transpose(0, 1)
    bias = fresh((512,), torch.float16, "cuda", generator=gen)
    dy = fresh((6, 8, 512), torch.float16, "cuda", generator=gen)
    leaves = [x.double().requires_grad_(), bias.double().requires_grad_()]
    want = torch.autograd.grad(bias_gelu_fp64(*leaves, "none"), leaves, dy.double())
    got = torch.ops.kiln.gelu_backward(dy, x, bias, "none")
    assert_close_to(got[0], want[0], torch.float16)
    assert_grad_close(got[1], want[1], torch.float16, summed_rows=48)


def test_tuned_backward_kernels_are_correct(tmp_path):
    """With tuning on, every candidate is checked against the heuristic's outputs (the bias
    reduction's fp32 partial sums included) and the winner computes the same gradients."""
    before = kiln.settings()
    kiln.configure(cache_dir=str(tmp_path), tune="fast")
    try:
        gen = torch.Generator(device="cuda").manual_seed(13)
        for op, form in [("swiglu", "packed"), ("geglu", "separate"), ("gelu", "erf bias")]:
            for rows, width in [(1, 8192), (4096, 3072)]:
                got, want = activation_case(op, form, rows, width, torch.bfloat16, gen)
                for g, w in zip(got, want):
                    assert_grad_close(g, w, torch.bfloat16, summed_rows=rows if g.dim() == 1 else 1)
        assert list(tmp_path.rglob("*.json")), "tuning results were not stored"
    finally:
        kiln.configure(cache_dir=before["cache_dir"], tune=before["tune_mode"])


# ---- rope ------------------------------------------------------------------------------

ROPE_CASES = [
    # (layout, q shape, k shape, rotary_dim, interleaved)
    ("bhsd", (1, 4, 1, 128), (1, 2, 1, 128), -1, False),  # one token, GQA
    ("bhsd", (2, 8, 37, 64), (2, 2, 37, 64), 32, False),  # partial rotary
    ("bshd", (2, 33, 6, 128), (2, 33, 6, 128), -1, True),  # FLUX-like
    ("bshd", (1, 20, 2 * 96), (1, 20, 96), -1, True),  # [B, S, H*D], head_dim from the table
]


@pytest.mark.parametrize("table_fp32", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ROPE_CASES, ids=lambda c: f"{c[0]}-{c[1]}-r{c[3]}-i{int(c[4])}")
def test_rope_backward_kernel(case, dtype, table_fp32):
    layout, q_shape, k_shape, rotary_dim, interleaved = case
    gen = torch.Generator(device="cuda").manual_seed(q_shape[-1])
    head_dim = q_shape[-1] if len(q_shape) == 4 else 96
    seq = q_shape[2] if layout == "bhsd" else q_shape[1]
    width = head_dim if rotary_dim == -1 else rotary_dim
    angles = torch.rand(seq, width // 2, device="cuda", dtype=torch.float64, generator=gen) * 6
    if interleaved:
        cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    else:
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    cos, sin = (cos.float(), sin.float()) if table_fp32 else (cos.to(dtype), sin.to(dtype))

    q64 = fresh(q_shape, dtype, "cuda", generator=gen).double().requires_grad_()
    k64 = fresh(k_shape, dtype, "cuda", generator=gen).double().requires_grad_()

    def to_bhsd(t):  # the fp64 formulas take [B, H, S, D]
        if layout == "bhsd":
            return t
        return (t if t.dim() == 4 else t.unflatten(-1, (-1, head_dim))).transpose(1, 2)

    qr, kr = to_bhsd(q64), to_bhsd(k64)
    if interleaved:
        ref_q, ref_k = diffusers_apply_rotary_emb(qr, cos, sin), diffusers_apply_rotary_emb(kr, cos, sin)
    else:
        b = qr.shape[0]
        c, s = cos.double()[None].expand(b, -1, -1), sin.double()[None].expand(b, -1, -1)
        ref_q, ref_k = hf_apply_rotary_pos_emb(qr, kr, c, s)
    gq = fresh(q_shape, dtype, "cuda", generator=gen)
    gk = fresh(k_shape, dtype, "cuda", generator=gen)
    want_q, want_k = torch.autograd.grad((ref_q, ref_k), (q64, k64),
                                         (to_bhsd(gq.double()), to_bhsd(gk.double())))
    poison((q_shape, dtype), (k_shape, dtype))
    got_q, got_k = torch.ops.kiln.rope_backward(gq, gk, cos, sin, interleaved, rotary_dim, layout)
    assert got_q.dtype == dtype and got_q.shape == q_shape and got_k.shape == k_shape
    assert_close_to(got_q, want_q, dtype)
    assert_close_to(got_k, want_k, dtype)


def test_rope_backward_non_contiguous_grads_and_float64_refused():
    gen = torch.Generator(device="cuda").manual_seed(2)
    gq = fresh((2, 16, 4, 64), torch.bfloat16, "cuda", generator=gen).transpose(1, 2)  # bhsd view
    gk = fresh((2, 4, 16, 80), torch.bfloat16, "cuda", generator=gen)[..., 8:72]
    angles = torch.rand(16, 32, device="cuda", generator=gen) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    got_q, got_k = torch.ops.kiln.rope_backward(gq, gk, cos, sin)
    want_q, want_k = torch.ops.kiln.rope_backward(gq.cpu().double(), gk.cpu().double(),
                                                  cos.cpu().double(), sin.cpu().double())
    assert_close_to(got_q.cpu(), want_q, torch.bfloat16)
    assert_close_to(got_k.cpu(), want_k, torch.bfloat16)
    with pytest.raises(TypeError, match=r"kiln\.rope_backward: grad_q: expected dtype float32, float16 or bfloat16 \(float64 runs on the CPU only\), got float64 on cuda:0"):
        torch.ops.kiln.rope_backward(gq.double(), gk.double(), cos, sin)


# ---- training through a module ---------------------------------------------------------

def _block_grads(use_kiln, compiled=False):
    torch.manual_seed(0)
    block = TinyBlock(use_kiln=use_kiln).cuda()
    x = torch.randn(2, 5, 16, device="cuda", requires_grad=True)
    angles = torch.rand(5, 2, device="cuda") * 3
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    fn = torch.compile(block, fullgraph=True, dynamic=True) if compiled else block
    fn(x, cos, sin).backward()
    return [x.grad] + [p.grad for p in block.parameters()]


@pytest.mark.parametrize("compiled", [False, True])
def test_loss_backward_through_a_module(compiled):
    for got, want in zip(_block_grads(True, compiled), _block_grads(False)):
        assert got is not None and not torch.isnan(got).any()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
