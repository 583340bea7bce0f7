"""Whether a model's rotary function and kiln's replacement of it agree on probes: each probe
called through both, the function's own failure told apart from kiln's, and (q, k) compared
as :func:`.detect._agree` compares a patched module's output."""

from typing import Callable, Iterable, Optional, Tuple

import torch

from .detect import _agree


def disagreement(function: Callable, replacement: Callable, probes: Iterable[Tuple[str, tuple]],
                 name: Optional[str] = None) -> Optional[Tuple[bool, str]]:
    """None when ``replacement(*args)`` gives what ``function(*args)`` gives for every
    ``(label, args)`` of ``probes`` (its tensors' dtype, say "[bshd] " or "3-D " in ``label``);
    else (whether the function itself failed on the probe, why they differ). ``name``: the
    function's, as messages call it (default its ``__name__``)."""
    name = name or function.__name__
    with torch.no_grad():
        for label, args in probes:
            dtype = args[0].dtype
            try:
                expected = function(*args)
            except Exception as e:
                return True, f"its {name} fails on a {label}probe ({type(e).__name__}: {e})"
            try:
                actual = replacement(*args)
            except Exception as e:
                return False, f"kiln.rope fails on a {dtype} probe ({type(e).__name__}: {e})"
            if not (isinstance(expected, tuple) and len(expected) == 2):
                return False, f"its {name} does not return (q, k)"
            for e, a in zip(expected, actual):
                why = _agree(e, a)
                if why is not None:
                    return False, f"on a {dtype} {label}probe kiln.rope {why}"
    return None
