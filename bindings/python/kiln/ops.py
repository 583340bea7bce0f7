"""Python spellings of kiln's ops (each one call of the op: through
``kiln._C.direct`` in eager code, ``torch.ops.kiln.*`` under torch.compile)."""

from typing import Optional

import torch

from ._direct import compiling as _compiling
from ._direct import direct as _direct

# The resolved overload: calling it skips the packet's overload lookup on every call.
_rms_norm = torch.ops.kiln.rms_norm.default
_rms_norm_out = torch.ops.kiln.rms_norm.out


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6,
             out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x * rsqrt(mean(x**2, -1) + eps) * weight`` over the last dimension.

    Math in fp32; the output has x's dtype and shape (contiguous), rounded once after the
    weight multiply. ``weight`` must have x's dtype and device and shape ``[x.shape[-1]]``.
    Any leading shape and non-contiguous inputs are accepted; zero rows give an empty result.
    ``out``: a preallocated result (x's shape, dtype and device, any layout) written in place
    and returned (``torch.ops.kiln.rms_norm.out``).
    """
    if out is not None:
        if _compiling():
            _rms_norm_out(x, weight, eps, out=out)
        else:
            _direct.rms_norm_out(x, weight, eps, out)
        return out
    if _compiling():
        return _rms_norm(x, weight, eps)
    return _direct.rms_norm(x, weight, eps)
