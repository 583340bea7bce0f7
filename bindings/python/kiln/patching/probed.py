"""The norm modules a patch that fuses them into another op's launch (a layer's residual add,
an attention's rotation) probed when it was installed: their class then, and the rule by which
their weight enters the fused op (as it is, or as ``1 + weight``). A norm set in their place
later, or of another class since (a subclass that inherits the forward and changes what it
calls), is not taken for them, and the fused op is not called for it.
"""

from typing import Optional

import torch

from . import forwards, replace
from .forwards import _offset_weight

# How a norm's weight enters the fused op: as it is (Llama's and Qwen3's rule, torch's
# nn.RMSNorm, a norm without weight), or as 1 + weight (Gemma's).
WEIGHT_AS_IS = "weight"
WEIGHT_PLUS_ONE = "1 + weight"

# Kept on the norm itself: a dictionary of norms read inside a compiled forward would make
# torch.compile guard on its size, and compile again whenever another model is patched.
_ATTR = "_kiln_probed"


def remember(norm: torch.nn.Module, rule: str) -> None:
    norm.__dict__[_ATTR] = (type(norm), rule)


def rule_of(norm) -> Optional[str]:
    """How ``norm``'s weight enters the fused op, where it was probed as it is now and runs as
    probed (its class's forward, no hook, no forward of its own but kiln's); else None."""
    probed = norm.__dict__.get(_ATTR) if isinstance(norm, torch.nn.Module) else None
    if probed is None or type(norm) is not probed[0] or not replace.runs_as_classified(norm, probed[0].forward):
        return None
    return probed[1]


def rule_of_match(match) -> Optional[str]:
    """The rule of a norm :func:`.detect.classify_norm` matched as an RMSNorm (its Match's
    factory), or None for anything else."""
    if getattr(match, "op", None) != "rms_norm":
        return None
    return WEIGHT_PLUS_ONE if match.factory is forwards.rms_norm_offset else WEIGHT_AS_IS


def fused_weight(norm: torch.nn.Module, rule: str, like: torch.Tensor, differentiable: bool):
    """(True, the [D] weight a fused op takes for the norm of ``like``'s rows, or None), or
    (False, None) where the fused op would not compute what the norm does. With a graph to
    record, a trained weight takes a ``differentiable`` op only (``1 + weight`` made in the
    graph, so the weight gets its gradient)."""
    weight = getattr(norm, "weight", None)
    if weight is None:
        return rule == WEIGHT_AS_IS, None
    if not isinstance(weight, torch.Tensor) or weight.shape != (like.shape[-1],) or weight.device != like.device:
        return False, None
    trained = torch.is_grad_enabled() and weight.requires_grad
    if trained and not differentiable:
        return False, None
    if rule == WEIGHT_PLUS_ONE:
        return True, (1.0 + weight.float()).to(like.dtype) if trained else _offset_weight(norm, like.dtype)
    return weight.dtype == like.dtype, weight
