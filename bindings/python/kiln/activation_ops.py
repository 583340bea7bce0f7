"""Python spellings of kiln's activation ops (each one call of the op: through
``kiln._C.direct`` in eager code, ``torch.ops.kiln.*`` under torch.compile).

Math in fp32, rounded once; the output has the inputs' dtype, which every input must share,
and is a new contiguous tensor (except ``gated_residual_``, which writes into ``h``). Inputs
of any leading shape and non-contiguous inputs are accepted; every input must be on one
device. ``approximate`` is ``"tanh"`` or ``"none"`` (erf), as ``F.gelu`` spells it; note
that kiln's default is ``"tanh"`` (the form LTX-Video, FLUX and GPT-style MLPs use), while
``F.gelu``'s is ``"none"``.
"""

from typing import Optional

import torch

from ._direct import compiling as _compiling
from ._direct import direct as _direct

# Resolved overloads: calling them skips the packet's overload lookup on every call.
_swiglu = torch.ops.kiln.swiglu.default
_geglu = torch.ops.kiln.geglu.default
_gelu = torch.ops.kiln.gelu.default
_gated_residual = torch.ops.kiln.gated_residual.default
_gated_residual_ = torch.ops.kiln.gated_residual_.default
_clamped_swiglu = torch.ops.kiln.clamped_swiglu.default


def _into(out: torch.Tensor, name: str, *args) -> torch.Tensor:
    """One call of the op's ``out=`` form (``torch.ops.kiln.<name>.out``, ``<name>_out`` in
    eager code) writing into ``out``; returns ``out``."""
    if _compiling():
        getattr(torch.ops.kiln, name).out(*args, out=out)
    else:
        getattr(_direct, name + "_out")(*args, out)
    return out


def swiglu(gate: torch.Tensor, up: Optional[torch.Tensor] = None, up_first: bool = False,
           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.silu(gate) * up``.

    With ``up=None``, ``gate`` is one packed ``[..., 2I]`` tensor (a fused gate_up
    projection) whose first half is the gate and second half up (the other way round when
    ``up_first``); the output is ``[..., I]``. ``out``: a preallocated result written in place
    and returned (``torch.ops.kiln.swiglu.out``, vLLM's ``silu_and_mul(out, x)``)."""
    if out is not None:
        return _into(out, "swiglu", gate, up, up_first)
    if _compiling():
        return _swiglu(gate, up, up_first)
    return _direct.swiglu(gate, up, up_first)


def geglu(gate: torch.Tensor, up: Optional[torch.Tensor] = None, approximate: str = "tanh",
          up_first: bool = False) -> torch.Tensor:
    """``F.gelu(gate, approximate=approximate) * up``; ``up=None`` as in :func:`swiglu`."""
    if _compiling():
        return _geglu(gate, up, approximate, up_first)
    return _direct.geglu(gate, up, approximate, up_first)


def clamped_swiglu(gate_up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0,
                   interleaved: bool = True) -> torch.Tensor:
    """GPT-OSS's expert gate (vLLM's ``swigluoai_and_mul``), from one packed ``[..., 2I]``
    tensor: with ``interleaved`` (GPT-OSS's ``gate_up_proj`` layout) gate and up are
    ``gate_up[..., ::2]`` and ``gate_up[..., 1::2]``, otherwise its first and second halves.
    With ``g = gate.clamp(max=limit)`` and ``u = up.clamp(-limit, limit)``, returns
    ``(u + 1) * g * torch.sigmoid(alpha * g)``, ``[..., I]``. ``limit`` must be > 0."""
    if _compiling():
        return _clamped_swiglu(gate_up, alpha, limit, interleaved)
    return _direct.clamped_swiglu(gate_up, alpha, limit, interleaved)


def gelu(x: torch.Tensor, bias: Optional[torch.Tensor] = None, approximate: str = "tanh",
         out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.gelu(x + bias, approximate=approximate)``; ``bias`` has shape ``[x.shape[-1]]``.
    ``out``: a preallocated result of x's shape, written in place and returned
    (``torch.ops.kiln.gelu.out``); it may be a slice of a wider buffer's last dimension (as
    ``buffer[..., d:]``), which the kernel writes directly, so a concatenation that follows
    need not copy the activation again."""
    if out is not None:
        return _into(out, "gelu", x, bias, approximate)
    if _compiling():
        return _gelu(x, bias, approximate)
    return _direct.gelu(x, bias, approximate)


def gated_residual(h: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``h + y * gate`` (the DiT gated residual). ``y`` has h's shape; ``gate`` has h's shape
    (a gate per token), or ``[B, 1, ..., 1, D]`` (per sample) or ``[1, ..., 1, D]`` / ``[D]``
    (one gate for all)."""
    if _compiling():
        return _gated_residual(h, y, gate)
    return _direct.gated_residual(h, y, gate)


def gated_residual_(h: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """:func:`gated_residual` written into ``h``; returns ``h``."""
    if _compiling():
        _gated_residual_(h, y, gate)
    else:
        _direct.gated_residual_(h, y, gate)
    return h
