"""Training support for rope, swiglu, geglu and gelu on the CPU path: gradcheck of each op's
registered autograd in float64 (the backward ops' CPU references against the numerical
Jacobian of the forwards), the backward ops against autograd of the fp64 formulas for every
dtype, opcheck of the backward ops and of the forwards' autograd registrations, compile, and
the backward ops' argument checks."""

import pytest
import torch
from torch.autograd import gradcheck

import kiln
from activation_reference import bias_gelu_fp64, fresh, geglu_fp64, swiglu_fp64
from reference import assert_close_to
from pointwise_block import TinyBlock
from rope_reference import diffusers_apply_rotary_emb, hf_apply_rotary_pos_emb

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
F64 = torch.float64


def leaf(*shape, scale=2.0):
    """A fresh float64 input that requires grad (values of both signs, never zeros)."""
    return fresh(shape, F64, scale=scale).requires_grad_()


def table(*shape):
    """A cos/sin stand-in whose halves (and pair members) differ, so the backward has to be
    the exact transpose, not just the rotation by the negative angle."""
    return torch.randn(*shape, dtype=F64)


# ---- rope ------------------------------------------------------------------------------

ROPE_CASES = [
    # (layout, q shape, k shape, table shape, rotary_dim, head_dim)
    ("bhsd", (2, 3, 5, 8), (2, 1, 5, 8), (5, 8), -1, -1),
    ("bhsd", (1, 2, 1, 6), (1, 2, 1, 6), (1, 6), -1, -1),  # one position, 3 pairs
    ("bhsd", (2, 2, 7, 12), (2, 1, 7, 12), (2, 1, 7, 8), 4, -1),  # partial rotary, 4-D table
    ("bshd", (2, 5, 3, 8), (2, 5, 1, 8), (2, 5, 8), -1, -1),
    ("bshd", (1, 3, 2 * 10), (1, 3, 10), (3, 10), -1, -1),  # [B, S, H*D] before the split
    ("bshd", (2, 4, 3 * 6), (2, 4, 2 * 6), (4, 6), 2, 6),  # 3-D with head_dim, partial
]


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("case", ROPE_CASES, ids=lambda c: f"{c[0]}-{c[1]}-r{c[4]}")
def test_rope_gradcheck(case, interleaved):
    layout, q_shape, k_shape, table_shape, rotary_dim, head_dim = case
    torch.manual_seed(sum(q_shape))
    q, k = leaf(*q_shape), leaf(*k_shape)
    cos, sin = table(*table_shape), table(*table_shape)

    def f(q, k):
        return kiln.rope(q, k, cos, sin, interleaved=interleaved, rotary_dim=rotary_dim,
                         layout=layout, head_dim=head_dim)

    assert gradcheck(f, (q, k), eps=1e-6, atol=1e-9, rtol=1e-7)


def test_rope_gradient_of_q_only_and_no_gradient_for_tables():
    q, k = leaf(1, 2, 3, 8), fresh((1, 1, 3, 8), F64)
    cos, sin = table(3, 8).requires_grad_(), table(3, 8).requires_grad_()
    out_q, out_k = kiln.rope(q, k, cos, sin)
    (out_q.sum() + out_k.sum()).backward()
    assert q.grad is not None and q.grad.shape == q.shape
    assert cos.grad is None and sin.grad is None
    assert gradcheck(lambda q: kiln.rope(q, k, cos.detach(), sin.detach())[0], (q,))


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_backward_matches_autograd_of_the_libraries_formulas(interleaved):
    torch.manual_seed(3)
    q, k = leaf(2, 4, 9, 16), leaf(2, 2, 9, 16)
    angles = torch.rand(9, 8, dtype=F64) * 6
    if interleaved:
        cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
        ref_q, ref_k = diffusers_apply_rotary_emb(q, cos, sin), diffusers_apply_rotary_emb(k, cos, sin)
    else:
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
        ref_q, ref_k = hf_apply_rotary_pos_emb(q, k, cos[None].expand(2, 9, 16), sin[None].expand(2, 9, 16))
    gq, gk = torch.randn_like(ref_q), torch.randn_like(ref_k)
    want_q, want_k = torch.autograd.grad((ref_q, ref_k), (q, k), (gq, gk))
    got_q, got_k = torch.ops.kiln.rope_backward(gq, gk, cos, sin, interleaved)
    torch.testing.assert_close(got_q, want_q, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_k, want_k, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq", [1, 6])
def test_rope_backward_every_dtype_against_fp64(dtype, seq):
    torch.manual_seed(seq)
    q64, k64 = leaf(2, 3, seq, 10), leaf(2, 1, seq, 10)
    cos, sin = table(2, seq, 6), table(2, seq, 6)
    ref_q, ref_k = hf_apply_rotary_pos_emb(q64, k64, cos, sin)
    gq, gk = fresh(ref_q.shape, dtype), fresh(ref_k.shape, dtype)
    want_q, want_k = torch.autograd.grad((ref_q, ref_k), (q64, k64), (gq.double(), gk.double()))
    got_q, got_k = torch.ops.kiln.rope_backward(gq, gk, cos.float(), sin.float())
    assert got_q.dtype == dtype and got_q.is_contiguous()
    assert_close_to(got_q, want_q, dtype)
    assert_close_to(got_k, want_k, dtype)


# ---- swiglu, geglu, gelu ---------------------------------------------------------------

GATED_SHAPES = [(1, 5), (6, 8), (2, 3, 7)]


def gated_inputs(shape, packed):
    if packed:
        return leaf(*shape[:-1], 2 * shape[-1]), None
    return leaf(*shape), leaf(*shape)


@pytest.mark.parametrize("shape", GATED_SHAPES)
@pytest.mark.parametrize("form", ["separate", "packed", "packed up_first"])
def test_swiglu_gradcheck(shape, form):
    torch.manual_seed(len(shape) + shape[-1])
    gate, up = gated_inputs(shape, form != "separate")
    up_first = "up_first" in form
    inputs = (gate,) if up is None else (gate, up)
    assert gradcheck(lambda g, u=None: kiln.swiglu(g, u, up_first=up_first), inputs)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("shape", GATED_SHAPES)
@pytest.mark.parametrize("form", ["separate", "packed", "packed up_first"])
def test_geglu_gradcheck(shape, form, approximate):
    torch.manual_seed(shape[-1])
    gate, up = gated_inputs(shape, form != "separate")
    up_first = "up_first" in form
    inputs = (gate,) if up is None else (gate, up)
    assert gradcheck(lambda g, u=None: kiln.geglu(g, u, approximate=approximate, up_first=up_first),
                     inputs)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("shape", [(1, 7), (5, 8), (2, 3, 9)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gelu_gradcheck(shape, with_bias, approximate):
    torch.manual_seed(shape[-1])
    x = leaf(*shape)
    if with_bias:
        bias = leaf(shape[-1], scale=0.5)
        assert gradcheck(lambda x, b: kiln.gelu(x, b, approximate=approximate), (x, bias))
    else:
        assert gradcheck(lambda x: kiln.gelu(x, approximate=approximate), (x,))


def test_only_the_inputs_that_need_a_gradient_get_one():
    gate, up = leaf(3, 8), fresh((3, 8), F64)
    kiln.swiglu(gate, up).sum().backward()
    assert gate.grad is not None and up.grad is None
    x, bias = fresh((4, 6), F64), leaf(6)
    kiln.gelu(x, bias).sum().backward()
    assert bias.grad is not None and x.grad is None
    torch.testing.assert_close(bias.grad, torch.autograd.grad(bias_gelu_fp64(x, bias).sum(), bias)[0])


def activation_case(op, form, shape, dtype, approximate):
    """(backward-op outputs, autograd gradients of the fp64 formula) on dtype inputs."""
    packed = "packed" in form
    up_first = "up_first" in form
    if op == "gelu":
        x = fresh(shape, dtype)
        bias = fresh(shape[-1:], dtype, scale=0.5) if "bias" in form else None
        inputs = [t for t in (x, bias) if t is not None]
        leaves = [t.double().requires_grad_() for t in inputs]
        ref = bias_gelu_fp64(leaves[0], leaves[1] if bias is not None else None, approximate)
        dy = fresh(ref.shape, dtype)
        got = torch.ops.kiln.gelu_backward(dy, x, bias, approximate)
    else:
        gate = fresh((*shape[:-1], 2 * shape[-1]) if packed else shape, dtype)
        up = None if packed else fresh(shape, dtype)
        inputs = [t for t in (gate, up) if t is not None]
        leaves = [t.double().requires_grad_() for t in inputs]
        up_leaf = None if packed else leaves[1]
        if op == "swiglu":
            ref = swiglu_fp64(leaves[0], up_leaf, up_first)
            dy = fresh(ref.shape, dtype)
            got = torch.ops.kiln.swiglu_backward(dy, gate, up, up_first)
        else:
            ref = geglu_fp64(leaves[0], up_leaf, approximate, up_first)
            dy = fresh(ref.shape, dtype)
            got = torch.ops.kiln.geglu_backward(dy, gate, up, approximate, up_first)
    want = torch.autograd.grad(ref, leaves, dy.double())
    return got, want


ACTIVATION_FORMS = [("swiglu", "separate", "tanh"), ("swiglu", "packed", "tanh"),
                    ("swiglu", "packed up_first", "tanh")] + [
    (op, form, approximate) for approximate in ("tanh", "none")
    for op, form in [("geglu", "separate"), ("geglu", "packed up_first"), ("gelu", "plain"),
                     ("gelu", "bias")]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op,form,approximate", ACTIVATION_FORMS)
def test_activation_backward_every_dtype_against_fp64(op, form, approximate, dtype):
    torch.manual_seed(11)
    for shape in [(1, 33), (7, 64), (2, 5, 9)]:
        got, want = activation_case(op, form, shape, dtype, approximate)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == dtype and g.is_contiguous()
            if g.dim() == 1:  # dbias: a sum over rows, so relative to the rows' scale
                scale = max(1.0, (w.abs().max().item()))
                assert_close_to(g / scale, w / scale, dtype)
            else:
                assert_close_to(g, w, dtype)


# ---- opcheck, compile ------------------------------------------------------------------

def _layouts(make):
    """Contiguous, permuted (leading dimensions transposed) and sliced (a strided last-dim
    window) versions of make(shape) -> tensor."""
    base = make((4, 6, 16))
    yield base
    yield make((6, 4, 16)).transpose(0, 1)
    yield make((4, 6, 24))[..., 3:19]


def test_opcheck_activation_backward_ops():
    for dtype in (torch.float32, torch.bfloat16):
        mk = lambda shape: fresh(shape, dtype)  # noqa: E731
        for gate, up, dy in zip(_layouts(mk), _layouts(mk), _layouts(mk)):
            torch.library.opcheck(torch.ops.kiln.swiglu_backward.default, (dy, gate, up, False))
            torch.library.opcheck(torch.ops.kiln.geglu_backward.default, (dy, gate, up, "none", False))
            torch.library.opcheck(torch.ops.kiln.gelu_backward.default, (dy, gate, None, "tanh"))
            torch.library.opcheck(torch.ops.kiln.gelu_backward.default,
                                  (dy, gate, fresh((16,), dtype), "none"))
            packed = torch.cat([gate, up], -1)
            torch.library.opcheck(torch.ops.kiln.swiglu_backward.default, (dy, packed, None, True))
            torch.library.opcheck(torch.ops.kiln.geglu_backward.default, (dy, packed, None, "tanh", False))


def test_opcheck_rope_backward():
    for dtype in (torch.float32, torch.bfloat16):
        cos, sin = torch.randn(6, 16), torch.randn(6, 16)
        grads = [
            (fresh((2, 3, 6, 16), dtype), fresh((2, 1, 6, 16), dtype)),
            (fresh((2, 6, 3, 16), dtype).transpose(1, 2), fresh((2, 6, 1, 16), dtype).transpose(1, 2)),
            (fresh((2, 3, 6, 20), dtype)[..., 2:18], fresh((2, 1, 6, 20), dtype)[..., 2:18]),
        ]
        for gq, gk in grads:
            for interleaved in (False, True):
                torch.library.opcheck(torch.ops.kiln.rope_backward.default,
                                      (gq, gk, cos, sin, interleaved, 8, "bhsd", -1))


def test_opcheck_forward_autograd_registrations():
    """opcheck with inputs that require grad checks that each forward's autograd is
    registered and that its backward traces (the backward ops' fakes) under AOT dispatch."""
    g = lambda *s: fresh(s, torch.float32).requires_grad_()  # noqa: E731
    torch.library.opcheck(torch.ops.kiln.swiglu.default, (g(3, 8), g(3, 8), False))
    torch.library.opcheck(torch.ops.kiln.swiglu.default, (g(3, 16), None, True))
    torch.library.opcheck(torch.ops.kiln.geglu.default, (g(3, 8), g(3, 8), "none", False))
    torch.library.opcheck(torch.ops.kiln.gelu.default, (g(3, 8), g(8), "tanh"))
    torch.library.opcheck(torch.ops.kiln.gelu.default, (g(3, 8), None, "none"))
    cos, sin = torch.randn(5, 8), torch.randn(5, 8)
    torch.library.opcheck(torch.ops.kiln.rope.default,
                          (g(2, 3, 5, 8), g(2, 1, 5, 8), cos, sin, True, -1, "bhsd", -1))


def _block_grads(use_kiln, compiled=False):
    torch.manual_seed(0)
    block = TinyBlock(use_kiln=use_kiln).double()
    x = torch.randn(2, 5, 16, dtype=F64, requires_grad=True)
    angles = torch.rand(5, 2, dtype=F64) * 3
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    fn = torch.compile(block, fullgraph=True, backend="aot_eager", dynamic=True) if compiled else block
    fn(x, cos, sin).backward()
    return [x.grad] + [p.grad for p in block.parameters()]


def test_loss_backward_through_a_module_matches_torch():
    for got, want in zip(_block_grads(True), _block_grads(False)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_loss_backward_under_compile_with_dynamic_shapes():
    for got, want in zip(_block_grads(True, compiled=True), _block_grads(False)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


# ---- argument checks -------------------------------------------------------------------

def test_backward_bad_inputs():
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match=r"kiln\.swiglu_backward: grad_out: expected shape \[3, 4\] \(the forward output's\), got \[3, 8\]"):
        torch.ops.kiln.swiglu_backward(torch.randn(3, 8), x)
    with pytest.raises(TypeError, match=r"kiln\.geglu_backward: grad_out: expected dtype float32 \(as gate\), got bfloat16"):
        torch.ops.kiln.geglu_backward(torch.randn(3, 8).bfloat16(), x, x)
    with pytest.raises(ValueError, match=r"kiln\.geglu_backward: approximate: expected 'tanh' or 'none', got 'erf'"):
        torch.ops.kiln.geglu_backward(x, x, x, "erf")
    with pytest.raises(ValueError, match=r"kiln\.gelu_backward: bias: expected shape \[8\]"):
        torch.ops.kiln.gelu_backward(x, x, torch.randn(7))
    with pytest.raises(ValueError, match=r"kiln\.gelu_backward: grad_out: expected shape \[3, 8\]"):
        torch.ops.kiln.gelu_backward(torch.randn(8), x)
    with pytest.raises(TypeError, match=r"kiln\.gelu_backward: x: expected dtype float32, float16, bfloat16 or \(on the CPU\) float64, got int64"):
        torch.ops.kiln.gelu_backward(x, torch.ones(3, 8, dtype=torch.long))
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match=r"kiln\.rope_backward: grad_k: expected grad_q's batch, sequence length and head dim"):
        torch.ops.kiln.rope_backward(q, torch.randn(1, 2, 4, 8), torch.randn(5, 8), torch.randn(5, 8))
    with pytest.raises(TypeError, match=r"kiln\.rope_backward: grad_k: expected dtype float32 \(as grad_q\), got float16"):
        torch.ops.kiln.rope_backward(q, q.half(), torch.randn(5, 8), torch.randn(5, 8))
    with pytest.raises(ValueError, match=r"kiln\.rope_backward: rotary_dim: expected an even rotated width"):
        torch.ops.kiln.rope_backward(q, q, torch.randn(5, 8), torch.randn(5, 8), False, 3)
