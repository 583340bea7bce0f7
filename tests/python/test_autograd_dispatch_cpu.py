"""The differentiable ops' autograd kernels are C++: a call that records no grad (no input
requires grad, or grad mode is off) runs no Python below the op's own entry point, so it
costs no more host time than an op without a backward; and a call that records grad gets
kiln's backward node."""

import sys

import pytest
import torch

import kiln  # noqa: F401  (registers the ops)


def r(*shape, grad=False):
    return torch.randn(*shape).requires_grad_(grad)


def calls(grad):
    """(name, zero-argument call) for every op with an autograd formula."""
    x, w, b = r(4, 16, grad=grad), r(16, grad=grad), r(16, grad=grad)
    x3 = r(2, 3, 16, grad=grad)
    scale, shift = r(2, 1, 16, grad=grad), r(2, 3, 16, grad=grad)
    q, k = r(1, 2, 5, 8, grad=grad), r(1, 1, 5, 8, grad=grad)
    cos, sin = torch.randn(5, 8), torch.randn(5, 8)
    residual, up = r(4, 16), r(4, 16)
    ops = torch.ops.kiln
    return [
        ("rms_norm", lambda: ops.rms_norm(x, w, 1e-6)),
        ("fused_add_rms_norm", lambda: ops.fused_add_rms_norm(x, residual, w, 1e-6)),
        ("layer_norm", lambda: ops.layer_norm(x, w, b, 1e-5)),
        ("adaln", lambda: ops.adaln(x3, scale, shift, None, 1e-6, "rms")),
        ("rope", lambda: ops.rope(q, k, cos, sin)),
        ("swiglu", lambda: ops.swiglu(x, up)),
        ("geglu", lambda: ops.geglu(x, up, "tanh")),
        ("gelu", lambda: ops.gelu(x, b, "none")),
    ]


def python_frames(fn):
    """The Python functions entered while fn() runs, other than the test's lambda and the
    op's own __call__."""
    entered = []

    def profile(frame, event, arg):
        if event == "call":
            entered.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return [f for f in entered
            if not f.endswith("torch/_ops.py:__call__") and not f.startswith(__file__ + ":")]


@pytest.mark.parametrize("name,call", calls(grad=False), ids=lambda v: v if isinstance(v, str) else "")
def test_call_without_grad_runs_no_python(name, call):
    call()  # first call: lazy initialisation may run Python
    assert python_frames(call) == []


@pytest.mark.parametrize("name,call", calls(grad=True), ids=lambda v: v if isinstance(v, str) else "")
def test_call_under_no_grad_runs_no_python(name, call):
    with torch.no_grad():
        call()
        assert python_frames(call) == []


@pytest.mark.parametrize("name,call", calls(grad=True), ids=lambda v: v if isinstance(v, str) else "")
def test_call_with_grad_records_kiln_backward(name, call):
    out = call()
    first = out[0] if isinstance(out, (tuple, list)) else out
    assert first.requires_grad
    assert "Function" in first.grad_fn.name() and "kiln" in first.grad_fn.name()


def tangent_calls(dual):
    """(name, the argument given the tangent, call) for every op with an autograd formula;
    `dual(t)` gives t a forward-mode tangent."""
    x, w, b = r(4, 16), r(16), r(16)
    x3, scale, shift = r(2, 3, 16), r(2, 1, 16), r(2, 3, 16)
    q, k = r(1, 2, 5, 8), r(1, 1, 5, 8)
    cos, sin = torch.randn(5, 8), torch.randn(5, 8)
    residual, up = r(4, 16), r(4, 16)
    return [
        ("rms_norm", "weight", lambda: kiln.rms_norm(x, dual(w))),
        ("fused_add_rms_norm", "residual", lambda: kiln.fused_add_rms_norm(x, dual(residual), w)),
        ("layer_norm", "x", lambda: kiln.layer_norm(dual(x), w, b)),
        ("adaln", "scale", lambda: kiln.adaln(x3, dual(scale), shift)),
        ("rope", "k", lambda: kiln.rope(q, dual(k), cos, sin)),
        ("swiglu", "up", lambda: kiln.swiglu(x, dual(up))),
        ("geglu", "gate", lambda: kiln.geglu(dual(x), up)),
        ("gelu", "bias", lambda: kiln.gelu(x, dual(b))),
    ]


@pytest.mark.parametrize("index", range(8))
def test_a_forward_ad_tangent_is_refused_not_dropped(index):
    """The backward formulas are reverse-mode only: a tangent on an input raises
    NotImplementedError naming the op and the argument, as torch's own ops without a forward
    derivative do, instead of the output coming back without one."""
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        name, arg, call = tangent_calls(lambda t: fwAD.make_dual(t, torch.ones_like(t)))[index]
        with pytest.raises(NotImplementedError,
                           match=rf"kiln\.{name} has no forward-mode derivative, but {arg} "
                                 rf"carries a tangent"):
            call()


def test_rope_takes_a_tangent_on_its_table_as_a_constant():
    """cos and sin are constants to RoPE's derivatives (its backward gives them none): a
    tangent on them alone is not refused, and q's output carries no tangent."""
    import torch.autograd.forward_ad as fwAD

    q, k, cos, sin = r(1, 2, 5, 8), r(1, 1, 5, 8), torch.randn(5, 8), torch.randn(5, 8)
    with fwAD.dual_level():
        q_out, _ = kiln.rope(q, k, fwAD.make_dual(cos, torch.ones_like(cos)), sin)
        assert fwAD.unpack_dual(q_out).tangent is None
