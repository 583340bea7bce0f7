"""Training support for rope, swiglu, geglu and gelu: ``torch.library.register_autograd``
for each, so ``loss.backward()`` runs kiln's backward kernels (``torch.ops.kiln.*_backward``)
eagerly and under ``torch.compile``.

Each setup_context keeps only what its backward reads (rope: cos and sin, never q or k;
the activations: their inputs), and each backward returns a gradient only for the inputs
that need one. RoPE gives no gradient to cos and sin (tables built from positions, not
trained); a cos or sin that requires grad is treated as a constant.
"""

import torch

_rope_backward = torch.ops.kiln.rope_backward.default
_swiglu_backward = torch.ops.kiln.swiglu_backward.default
_geglu_backward = torch.ops.kiln.geglu_backward.default
_gelu_backward = torch.ops.kiln.gelu_backward.default


def _needed(ctx, index, grad):
    return grad if ctx.needs_input_grad[index] else None


# ---- rope(q, k, cos, sin, interleaved, rotary_dim, layout, head_dim) -> (q, k)

def _rope_setup_context(ctx, inputs, output):
    _, _, cos, sin, interleaved, rotary_dim, layout, head_dim = inputs
    ctx.save_for_backward(cos, sin)
    ctx.options = (interleaved, rotary_dim, layout, head_dim)


def _rope_backward_fn(ctx, grad_q, grad_k):
    cos, sin = ctx.saved_tensors
    dq, dk = _rope_backward(grad_q, grad_k, cos, sin, *ctx.options)
    return _needed(ctx, 0, dq), _needed(ctx, 1, dk), None, None, None, None, None, None


# ---- swiglu(gate, up=None, up_first) and geglu(gate, up=None, approximate, up_first)

def _gated_grads(ctx, grads):
    if len(grads) == 1:  # packed gate_up: one gradient in its layout
        return _needed(ctx, 0, grads[0]), None
    return _needed(ctx, 0, grads[0]), _needed(ctx, 1, grads[1])


def _swiglu_setup_context(ctx, inputs, output):
    gate, up, up_first = inputs
    ctx.save_for_backward(gate, up)
    ctx.up_first = up_first


def _swiglu_backward_fn(ctx, grad):
    gate, up = ctx.saved_tensors
    return (*_gated_grads(ctx, _swiglu_backward(grad, gate, up, ctx.up_first)), None)


def _geglu_setup_context(ctx, inputs, output):
    gate, up, approximate, up_first = inputs
    ctx.save_for_backward(gate, up)
    ctx.approximate = approximate
    ctx.up_first = up_first


def _geglu_backward_fn(ctx, grad):
    gate, up = ctx.saved_tensors
    grads = _geglu_backward(grad, gate, up, ctx.approximate, ctx.up_first)
    return (*_gated_grads(ctx, grads), None, None)


# ---- gelu(x, bias=None, approximate)

def _gelu_setup_context(ctx, inputs, output):
    x, bias, approximate = inputs
    ctx.save_for_backward(x, bias)
    ctx.approximate = approximate


def _gelu_backward_fn(ctx, grad):
    x, bias = ctx.saved_tensors
    grads = _gelu_backward(grad, x, bias, ctx.approximate)
    dbias = _needed(ctx, 1, grads[1]) if bias is not None else None
    return _needed(ctx, 0, grads[0]), dbias, None


torch.library.register_autograd("kiln::rope", _rope_backward_fn, setup_context=_rope_setup_context)
torch.library.register_autograd("kiln::swiglu", _swiglu_backward_fn,
                                setup_context=_swiglu_setup_context)
torch.library.register_autograd("kiln::geglu", _geglu_backward_fn,
                                setup_context=_geglu_setup_context)
torch.library.register_autograd("kiln::gelu", _gelu_backward_fn, setup_context=_gelu_setup_context)
