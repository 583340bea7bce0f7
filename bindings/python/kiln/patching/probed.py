"""The norm modules a patch that fuses them into another op's launch (a layer's residual add,
an attention's rotation) probed when it was installed: their class then, and the rule by which
their weight enters the fused op (as it is, or as ``1 + weight``). A norm set in their place
later, or of another class since (a subclass that inherits the forward and changes what it
calls), is not taken for them, and the fused op is not called for it.
"""

from typing import Optional

import torch

from . import replace

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
