"""Fake (meta) implementations of the backward ops of rope, swiglu, geglu, gelu and
clamped_swiglu: new tensors of the inputs' shapes and dtype (contiguous; rope's laid out as its
gradients are), with the real implementations' checks of grad_out against the forward output's
shape."""

import torch

from ._fakes_activation import clamped_swiglu_shape
from ._fakes_rope import rope_output


def _check_grad_out(op, grad_out, ref_arg, ref, shape):
    torch._check(grad_out.dtype == ref.dtype,
                 lambda: f"kiln.{op}: grad_out: expected dtype {ref.dtype} (as {ref_arg}), got {grad_out.dtype}")
    torch._check(grad_out.device == ref.device,
                 lambda: f"kiln.{op}: grad_out: expected device {ref.device} (as {ref_arg}), got {grad_out.device}")
    torch._check(list(grad_out.shape) == list(shape),
                 lambda: f"kiln.{op}: grad_out: expected shape {list(shape)} (the forward output's), got {list(grad_out.shape)}")


def _gated_backward(op, grad_out, gate, up):
    torch._check(gate.dim() >= 1, lambda: f"kiln.{op}: gate: expected at least 1 dimension")
    if up is not None:
        torch._check(up.dtype == gate.dtype and up.shape == gate.shape,
                     lambda: f"kiln.{op}: up: expected gate's dtype and shape {list(gate.shape)}, got {up.dtype} {list(up.shape)}")
        _check_grad_out(op, grad_out, "gate", gate, gate.shape)
        return [gate.new_empty(gate.shape), up.new_empty(up.shape)]
    torch._check(gate.shape[-1] % 2 == 0,
                 lambda: f"kiln.{op}: gate: expected a packed last dimension 2*I, got {list(gate.shape)}")
    _check_grad_out(op, grad_out, "gate", gate, (*gate.shape[:-1], gate.shape[-1] // 2))
    return [gate.new_empty(gate.shape)]


def _check_approximate(op, approximate):
    torch._check(approximate in ("tanh", "none"),
                 lambda: f"kiln.{op}: approximate: expected 'tanh' or 'none', got '{approximate}'")


@torch.library.register_fake("kiln::swiglu_backward")
def _swiglu_backward_fake(grad_out, gate, up=None, up_first=False):
    return _gated_backward("swiglu_backward", grad_out, gate, up)


@torch.library.register_fake("kiln::geglu_backward")
def _geglu_backward_fake(grad_out, gate, up=None, approximate="tanh", up_first=False):
    _check_approximate("geglu_backward", approximate)
    return _gated_backward("geglu_backward", grad_out, gate, up)


@torch.library.register_fake("kiln::clamped_swiglu_backward")
def _clamped_swiglu_backward_fake(grad_out, gate_up, alpha, limit, interleaved):
    op = "clamped_swiglu_backward"
    _check_grad_out(op, grad_out, "gate_up", gate_up, clamped_swiglu_shape(op, gate_up, alpha, limit))
    return gate_up.new_empty(gate_up.shape)


@torch.library.register_fake("kiln::gelu_backward")
def _gelu_backward_fake(grad_out, x, bias=None, approximate="tanh"):
    _check_approximate("gelu_backward", approximate)
    torch._check(x.dim() >= 1, lambda: "kiln.gelu_backward: x: expected at least 1 dimension")
    _check_grad_out("gelu_backward", grad_out, "x", x, x.shape)
    if bias is None:
        return [x.new_empty(x.shape)]
    torch._check(bias.dim() == 1 and bias.shape[0] == x.shape[-1],
                 lambda: f"kiln.gelu_backward: bias: expected shape [{x.shape[-1]}], got {list(bias.shape)}")
    torch._check(bias.dtype == x.dtype,
                 lambda: f"kiln.gelu_backward: bias: expected dtype {x.dtype} (as x), got {bias.dtype}")
    return [x.new_empty(x.shape), bias.new_empty(bias.shape)]


@torch.library.register_fake("kiln::rope_backward")
def _rope_backward_fake(grad_q, grad_k, cos, sin, interleaved=False, rotary_dim=-1, layout="bhsd",
                        head_dim=-1, deinterleave=False):
    torch._check_value(not (interleaved and deinterleave),
                       lambda: "kiln.rope_backward: deinterleave: expected false with interleaved=True (it "
                               "de-interleaves pairs for a rotate_half rotation), got true")
    for name, t in (("grad_k", grad_k), ("cos", cos), ("sin", sin)):
        if t.device != grad_q.device:
            raise ValueError(f"kiln.rope_backward: {name}: expected device {grad_q.device} (as grad_q), got {t.device}")
    torch._check(layout in ("bhsd", "bshd"),
                 lambda: f'kiln.rope_backward: layout: expected "bhsd" or "bshd", got "{layout}"')
    torch._check(grad_k.dtype == grad_q.dtype,
                 lambda: f"kiln.rope_backward: grad_k: expected dtype {grad_q.dtype} (as grad_q), got {grad_k.dtype}")
    torch._check(grad_q.dim() == grad_k.dim() and grad_q.dim() in (3, 4),
                 lambda: f"kiln.rope_backward: grad_q, grad_k: expected 4 dimensions (or 3 in bshd), got {grad_q.dim()}, {grad_k.dim()}")
    return rope_output(grad_q), rope_output(grad_k)
