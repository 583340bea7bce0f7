"""Training support for the norm ops: their autograd formulas, registered with
``torch.library.register_autograd``, so ``loss.backward()`` runs through kiln's backward
kernels (``torch.ops.kiln.*_backward``), eagerly and under ``torch.compile``.

The forward ops save their inputs, not their row statistics: the backward kernels recompute
mean and rstd from x, which they read anyway. A gradient nobody asked for
(``ctx.needs_input_grad``) is returned as None.
"""

import torch

_rms_norm_backward = torch.ops.kiln.rms_norm_backward.default
_fused_add_rms_norm_backward = torch.ops.kiln.fused_add_rms_norm_backward.default
_layer_norm_backward = torch.ops.kiln.layer_norm_backward.default
_adaln_backward = torch.ops.kiln.adaln_backward.default


def _wanted(ctx, index, grad):
    # The dispatcher drops trailing arguments equal to their defaults, so needs_input_grad
    # may be shorter than the schema (the extra gradients returned are None).
    needs = ctx.needs_input_grad
    return grad if index < len(needs) and needs[index] else None


# ---- rms_norm(x, weight, eps)


def _rms_norm_setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_norm_grad(ctx, dy):
    x, weight = ctx.saved_tensors
    dx, dweight = _rms_norm_backward(dy, x, weight, ctx.eps)
    return _wanted(ctx, 0, dx), _wanted(ctx, 1, dweight), None


# ---- fused_add_rms_norm(x, residual, weight, eps) -> (y, r), r = x + residual


def _fused_add_rms_norm_setup(ctx, inputs, output):
    _, _, weight, eps = inputs
    ctx.save_for_backward(output[1], weight)
    ctx.eps = eps


def _fused_add_rms_norm_grad(ctx, dy, dr):
    r, weight = ctx.saved_tensors
    if dr is None:
        dsum, dweight = _rms_norm_backward(dy, r, weight, ctx.eps)
    else:
        dsum, dweight = _fused_add_rms_norm_backward(dy, dr, r, weight, ctx.eps)
    return _wanted(ctx, 0, dsum), _wanted(ctx, 1, dsum), _wanted(ctx, 2, dweight), None


# ---- layer_norm(x, weight, bias, eps)


def _layer_norm_setup(ctx, inputs, output):
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.eps = eps


def _layer_norm_grad(ctx, dy):
    x, weight, bias = ctx.saved_tensors
    dx, dweight, dbias = _layer_norm_backward(dy, x, weight, bias, ctx.eps)
    return _wanted(ctx, 0, dx), _wanted(ctx, 1, dweight), _wanted(ctx, 2, dbias), None


# ---- adaln(x, scale, shift, weight, eps, norm, table_scale, table_shift)


def _adaln_setup(ctx, inputs, output):
    x, scale, shift, weight, eps, norm, table_scale, table_shift = inputs
    ctx.save_for_backward(x, scale, weight, table_scale)
    ctx.eps = eps
    ctx.norm = norm
    # A per-token shift's gradient is dy itself; a per-sample one is dy summed per sample.
    ctx.shift_per_token = shift.shape[1] != 1
    ctx.has_tables = table_scale is not None


def _adaln_grad(ctx, dy):
    x, scale, weight, table_scale = ctx.saved_tensors
    dx, dscale, dshift, dweight = _adaln_backward(
        dy, x, scale, weight, ctx.eps, ctx.norm, table_scale, ctx.shift_per_token
    )
    if ctx.shift_per_token:
        dshift = dy
    dtable_scale = dtable_shift = None
    if ctx.has_tables:
        # The table row is added to every sample's (and token's) operand.
        dtable_scale = dscale.sum((0, 1), dtype=torch.float32).to(dscale.dtype)
        dtable_shift = dshift.sum((0, 1), dtype=torch.float32).to(dshift.dtype)
    return (
        _wanted(ctx, 0, dx),
        _wanted(ctx, 1, dscale),
        _wanted(ctx, 2, dshift),
        _wanted(ctx, 3, dweight),
        None,
        None,
        _wanted(ctx, 6, dtable_scale),
        _wanted(ctx, 7, dtable_shift),
    )


torch.library.register_autograd("kiln::rms_norm", _rms_norm_grad, setup_context=_rms_norm_setup)
torch.library.register_autograd(
    "kiln::fused_add_rms_norm", _fused_add_rms_norm_grad, setup_context=_fused_add_rms_norm_setup
)
torch.library.register_autograd("kiln::layer_norm", _layer_norm_grad, setup_context=_layer_norm_setup)
torch.library.register_autograd("kiln::adaln", _adaln_grad, setup_context=_adaln_setup)
