"""Python spellings of the norm ops (each one call of the op: through
``kiln._C.direct`` in eager code, ``torch.ops.kiln.*`` under torch.compile).

Dtype rule, for every op here: all tensors have x's dtype (a TypeError names the one that
does not), and every output has that dtype too: math in fp32, each output rounded once. The
residual stream of the fused ops is rounded to x's dtype before it is normalised, so the
normalised output is exactly the norm of the residual that is returned (as the eager
composition of the modules computes it).
"""

from typing import Optional, Tuple

import torch

from ._direct import compiling as _compiling
from ._direct import direct as _direct

_fused_add_rms_norm = torch.ops.kiln.fused_add_rms_norm.default
_fused_add_rms_norm_ = torch.ops.kiln.fused_add_rms_norm_.default
_layer_norm = torch.ops.kiln.layer_norm.default
_adaln = torch.ops.kiln.adaln.default
_gated_adaln = torch.ops.kiln.gated_adaln.default
_rms_norm_gated = torch.ops.kiln.rms_norm_gated.default

Tensor = torch.Tensor


def fused_add_rms_norm(
    x: Tensor, residual: Tensor, weight: Optional[Tensor] = None, eps: float = 1e-6
) -> Tuple[Tensor, Tensor]:
    """``r = x + residual``; returns ``(rms_norm(r, weight, eps), r)`` (new tensors)."""
    if _compiling():
        return _fused_add_rms_norm(x, residual, weight, eps)
    return _direct.fused_add_rms_norm(x, residual, weight, eps)


def fused_add_rms_norm_(x: Tensor, residual: Tensor, weight: Optional[Tensor] = None, eps: float = 1e-6) -> None:
    """In place, as vLLM's serving loop expects: ``residual <- x + residual`` and
    ``x <- rms_norm(residual, weight, eps)``."""
    if _compiling():
        _fused_add_rms_norm_(x, residual, weight, eps)
    else:
        _direct.fused_add_rms_norm_(x, residual, weight, eps)


def rms_norm_gated(
    x: Tensor,
    gate: Tensor,
    weight: Optional[Tensor] = None,
    eps: float = 1e-6,
    activation: str = "silu",
    norm_before_gate: bool = True,
) -> Tensor:
    """``rms_norm(x, weight, eps) * silu(gate)`` (``activation="sigmoid"``: ``* sigmoid(gate)``),
    normalised before it is gated: the gated RMSNorm that closes the linear attention of
    Qwen3-Next and Qwen3.5 (silu), Kimi Linear and GLM-5 Next (sigmoid). With
    ``norm_before_gate=False``, ``rms_norm(x * silu(gate), weight, eps)``: Mamba-2's gated norm
    (the gated x is rounded to x's dtype once before it is normalised). ``gate`` has x's shape;
    both may be strided views (a slice of a projection). Inference only: a call that needs a
    gradient raises (``kiln.patch`` keeps the module's own forward for those)."""
    if _compiling():
        return _rms_norm_gated(x, gate, weight, eps, activation, norm_before_gate)
    return _direct.rms_norm_gated(x, gate, weight, eps, activation, norm_before_gate)


def layer_norm(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """``(x - mean) * rsqrt(var + eps) * weight + bias`` over the last dimension (biased
    variance, as ``F.layer_norm``); weight and bias are optional (FLUX, Wan and the
    LTX-Video output norm use neither)."""
    if _compiling():
        return _layer_norm(x, weight, bias, eps)
    return _direct.layer_norm(x, weight, bias, eps)


def adaln(
    x: Tensor,
    scale: Tensor,
    shift: Tensor,
    weight: Optional[Tensor] = None,
    eps: float = 1e-6,
    norm: str = "rms",
    table_scale: Optional[Tensor] = None,
    table_shift: Optional[Tensor] = None,
) -> Tensor:
    """The DiT modulation ``norm(x) * (1 + scale) + shift`` for x ``[B, T, D]``.

    ``norm`` is ``"rms"`` (RMSNorm, ``weight`` optional) or ``"layer"`` (LayerNorm without
    affine parameters; ``weight`` still multiplies if given). ``scale`` and ``shift`` are
    ``[B, 1, D]`` (per sample) or ``[B, T, D]`` (per token); any strides with a unit last
    stride are read in place, so slices of a packed ``[B, T, K, D]`` tensor cost no copy.
    ``table_scale`` / ``table_shift`` (``[D]``) are added to them first: diffusers'
    ``scale_shift_table[i] + temb[..., i, :]`` without materialising the sum.
    """
    if _compiling():
        return _adaln(x, scale, shift, weight, eps, norm, table_scale, table_shift)
    return _direct.adaln(x, scale, shift, weight, eps, norm, table_scale, table_shift)


def gated_adaln(
    h: Tensor,
    y: Tensor,
    gate: Tensor,
    scale: Tensor,
    shift: Tensor,
    weight: Optional[Tensor] = None,
    eps: float = 1e-6,
    norm: str = "rms",
    table_gate: Optional[Tensor] = None,
    table_scale: Optional[Tensor] = None,
    table_shift: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """The DiT block seam in one pass: ``h2 = h + y * gate``, then
    ``out = norm(h2) * (1 + scale) + shift``; returns ``(h2, out)``. Shapes and table rows as
    in :func:`adaln` (``table_gate`` too)."""
    if _compiling():
        return _gated_adaln(h, y, gate, scale, shift, weight, eps, norm, table_gate, table_scale, table_shift)
    return _direct.gated_adaln(h, y, gate, scale, shift, weight, eps, norm, table_gate, table_scale, table_shift)


def ada_values(temb: Tensor, num_params: int) -> Tensor:
    """diffusers' ``temb.reshape(B, T, num_params, D)`` as a view: ``ada_values(temb, 6)[:, :, i]``
    is the ``i``-th operand, to pass with ``table[i]`` as a table row (no copy, no sum).

    Where autograd records (training), take the operands with ``.unbind(2)`` rather than one
    index each: autograd turns each indexed view's gradient into a zero-filled tensor of
    temb's whole size and adds them up, where unbind's gradient is one stack."""
    b, t = temb.shape[0], temb.shape[1]
    return temb.reshape(b, t, num_params, -1)
