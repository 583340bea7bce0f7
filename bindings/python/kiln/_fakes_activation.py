"""Fake (meta) implementations of the activation ops: shapes and dtypes only, mirroring the
real implementations' rules (a new contiguous tensor of the inputs' dtype)."""

import math

import torch


def _check_same(op, arg, t, ref_arg, ref):
    torch._check(t.dtype == ref.dtype,
                 lambda: f"kiln.{op}: {arg}: expected dtype {ref.dtype} (as {ref_arg}), got {t.dtype}")
    torch._check(t.shape == ref.shape,
                 lambda: f"kiln.{op}: {arg}: expected shape {list(ref.shape)} (as {ref_arg}), got {list(t.shape)}")


def _gated(op, gate, up):
    torch._check(gate.dim() >= 1, lambda: f"kiln.{op}: gate: expected at least 1 dimension")
    if up is not None:
        _check_same(op, "up", up, "gate", gate)
        return gate.new_empty(gate.shape)
    torch._check(gate.shape[-1] % 2 == 0,
                 lambda: f"kiln.{op}: gate: expected a packed last dimension 2*I, got {list(gate.shape)}")
    return gate.new_empty((*gate.shape[:-1], gate.shape[-1] // 2))


@torch.library.register_fake("kiln::swiglu")
def _swiglu_fake(gate, up=None, up_first=False):
    return _gated("swiglu", gate, up)


@torch.library.register_fake("kiln::swiglu.out")
def _swiglu_out_fake(gate, up=None, up_first=False, *, out):
    from ._fakes import check_out

    check_out("swiglu", out, _gated("swiglu", gate, up).shape, gate)


def clamped_swiglu_shape(op, gate_up, alpha, limit):
    """The output shape of clamped_swiglu (and its backward's grad_out), after its checks."""
    torch._check(gate_up.dim() >= 1, lambda: f"kiln.{op}: gate_up: expected at least 1 dimension")
    torch._check(gate_up.shape[-1] % 2 == 0,
                 lambda: f"kiln.{op}: gate_up: expected a packed last dimension 2*I, got {list(gate_up.shape)}")
    torch._check(math.isfinite(alpha), lambda: f"kiln.{op}: alpha: expected a finite number, got {alpha}")
    torch._check(math.isfinite(limit) and limit > 0,
                 lambda: f"kiln.{op}: limit: expected a finite number > 0, got {limit}")
    return (*gate_up.shape[:-1], gate_up.shape[-1] // 2)


@torch.library.register_fake("kiln::clamped_swiglu")
def _clamped_swiglu_fake(gate_up, alpha=1.702, limit=7.0, interleaved=True):
    return gate_up.new_empty(clamped_swiglu_shape("clamped_swiglu", gate_up, alpha, limit))


@torch.library.register_fake("kiln::geglu")
def _geglu_fake(gate, up=None, approximate="tanh", up_first=False):
    torch._check(approximate in ("tanh", "none"),
                 lambda: f"kiln.geglu: approximate: expected 'tanh' or 'none', got '{approximate}'")
    return _gated("geglu", gate, up)


@torch.library.register_fake("kiln::gelu")
def _gelu_fake(x, bias=None, approximate="tanh"):
    torch._check(approximate in ("tanh", "none"),
                 lambda: f"kiln.gelu: approximate: expected 'tanh' or 'none', got '{approximate}'")
    torch._check(x.dim() >= 1, lambda: "kiln.gelu: x: expected at least 1 dimension")
    if bias is not None:
        torch._check(bias.dim() == 1 and bias.shape[0] == x.shape[-1],
                     lambda: f"kiln.gelu: bias: expected shape [{x.shape[-1]}], got {list(bias.shape)}")
        torch._check(bias.dtype == x.dtype,
                     lambda: f"kiln.gelu: bias: expected dtype {x.dtype} (as x), got {bias.dtype}")
    return x.new_empty(x.shape)


@torch.library.register_fake("kiln::gelu.out")
def _gelu_out_fake(x, bias=None, approximate="tanh", *, out):
    from ._fakes import check_out

    check_out("gelu", out, _gelu_fake(x, bias, approximate).shape, x)


def _check_gated_residual(op, h, y, gate):
    _check_same(op, "y", y, "h", h)
    torch._check(gate.dtype == h.dtype,
                 lambda: f"kiln.{op}: gate: expected dtype {h.dtype} (as h), got {gate.dtype}")
    torch._check(gate.dim() <= h.dim() and gate.shape[-1] == h.shape[-1],
                 lambda: f"kiln.{op}: gate: expected a shape that broadcasts over h, got {list(gate.shape)}")


@torch.library.register_fake("kiln::gated_residual")
def _gated_residual_fake(h, y, gate):
    _check_gated_residual("gated_residual", h, y, gate)
    return h.new_empty(h.shape)


@torch.library.register_fake("kiln::gated_residual_")
def _gated_residual_inplace_fake(h, y, gate):
    _check_gated_residual("gated_residual_", h, y, gate)
    return None
