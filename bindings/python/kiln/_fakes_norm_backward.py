"""Fake (meta) implementations of the norm backward ops: shapes and dtypes only, mirroring
the real implementations (dx like x; parameter gradients of the parameter's shape, None
where the parameter is not given or its gradient is not asked for; adaln's dscale of scale's
shape, dshift [B, 1, D] unless shift is per token, table row gradients [D])."""

import torch

from ._fakes_norm import _check_like, _check_parameter


def _grad_like(p, wanted=True):
    return None if p is None or not wanted else p.new_empty(p.shape)


@torch.library.register_fake("kiln::rms_norm_backward")
def _rms_norm_backward_fake(dy, x, weight, eps=1e-6, weight_grad=True):
    _check_like("rms_norm_backward", "dy", dy, x)
    _check_parameter("rms_norm_backward", "weight", weight, x)
    return x.new_empty(x.shape), _grad_like(weight, weight_grad)


@torch.library.register_fake("kiln::fused_add_rms_norm_backward")
def _fused_add_rms_norm_backward_fake(dy, dr, r, weight, eps=1e-6, weight_grad=True):
    _check_like("fused_add_rms_norm_backward", "dy", dy, r)
    _check_like("fused_add_rms_norm_backward", "dr", dr, r)
    _check_parameter("fused_add_rms_norm_backward", "weight", weight, r)
    return r.new_empty(r.shape), _grad_like(weight, weight_grad)


@torch.library.register_fake("kiln::layer_norm_backward")
def _layer_norm_backward_fake(dy, x, weight=None, bias=None, eps=1e-5, weight_grad=True, bias_grad=True):
    _check_like("layer_norm_backward", "dy", dy, x)
    _check_parameter("layer_norm_backward", "weight", weight, x)
    _check_parameter("layer_norm_backward", "bias", bias, x)
    return x.new_empty(x.shape), _grad_like(weight, weight_grad), _grad_like(bias, bias_grad)


@torch.library.register_fake("kiln::adaln_backward")
def _adaln_backward_fake(
    dy,
    x,
    scale,
    weight=None,
    eps=1e-6,
    norm="rms",
    table_scale=None,
    shift_per_token=False,
    scale_grad=True,
    shift_grad=True,
    weight_grad=True,
    table_scale_grad=False,
    table_shift_grad=False,
):
    op = "adaln_backward"
    torch._check_value(x.dim() == 3, lambda: f"kiln.{op}: x: expected shape [B, T, D], got {list(x.shape)}")
    _check_like(op, "dy", dy, x)
    torch._check_value(
        scale.dim() == 3 and scale.shape[0] == x.shape[0] and scale.shape[2] == x.shape[2],
        lambda: f"kiln.{op}: scale: expected shape [B, 1, D] or [B, T, D], got {list(scale.shape)}",
    )
    torch._check_type(
        scale.dtype == x.dtype, lambda: f"kiln.{op}: scale: expected dtype {x.dtype} (as x), got {scale.dtype}"
    )
    _check_parameter(op, "weight", weight, x)
    _check_parameter(op, "table_scale", table_scale, x)
    dscale = scale.new_empty(scale.shape) if scale_grad else None
    dshift = x.new_empty((x.shape[0], 1, x.shape[2])) if shift_grad and not shift_per_token else None
    row = x.new_empty((x.shape[2],))
    return (
        x.new_empty(x.shape),
        dscale,
        dshift,
        _grad_like(weight, weight_grad),
        row if table_scale_grad else None,
        row.new_empty(row.shape) if table_shift_grad else None,
    )
