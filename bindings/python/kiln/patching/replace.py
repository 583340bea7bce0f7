"""Swapping a module's forward on the instance, and putting the original back.

accelerate's hooks (``add_hook_to_module``, ``enable_model_cpu_offload``) keep the
module's forward as ``module._old_forward`` and set ``module.forward`` to a wrapper that
calls it between the hook's pre- and post-forward. Where that attribute is there, the
replacement goes into ``_old_forward``: inside the hook, which still moves the weights
and inputs around it. A hook added after the patch takes the patched forward as its
``_old_forward`` the same way, and ``unpatch`` finds it there.
"""

import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch

_STATE = "_kiln_patch"
_HOOKED = "_old_forward"


@dataclass(frozen=True)
class PatchState:
    original: Callable  # the inner forward the patch replaced (bound to the module)
    patched: Callable
    kind: str
    op: str


def inner_forward(module: torch.nn.Module) -> Callable:
    """The forward that computes the module's result: the hooked one under accelerate."""
    return module.__dict__[_HOOKED] if _HOOKED in module.__dict__ else module.forward


def state_of(module: torch.nn.Module) -> Optional[PatchState]:
    return module.__dict__.get(_STATE)


def install(module: torch.nn.Module, original: Callable, patched: Callable, kind: str, op: str) -> None:
    attr = _HOOKED if _HOOKED in module.__dict__ else "forward"
    module.__dict__[attr] = patched
    module.__dict__[_STATE] = PatchState(original, patched, kind, op)


def _is_class_forward(module: torch.nn.Module, fn: Callable) -> bool:
    return getattr(fn, "__self__", None) is module and getattr(fn, "__func__", None) is type(module).forward


def uninstall(module: torch.nn.Module, path: str) -> bool:
    """Puts the original forward back wherever the patched one is now; False if the
    module was not patched (or its patched forward could not be found)."""
    state = module.__dict__.pop(_STATE, None)
    if state is None:
        return False
    module.__dict__.pop("_kiln_offset_weight", None)
    restored = False
    if module.__dict__.get(_HOOKED) is state.patched:
        module.__dict__[_HOOKED] = state.original
        restored = True
    if module.__dict__.get("forward") is state.patched:
        if _is_class_forward(module, state.original):
            del module.__dict__["forward"]  # the class's own forward again, as before
        else:
            module.__dict__["forward"] = state.original
        restored = True
    if not restored:
        module.__dict__[_STATE] = state
        warnings.warn(f"kiln.unpatch: {path or '<model>'}: its forward was wrapped by something "
                      "other than an accelerate hook after kiln.patch; left as it is", stacklevel=3)
        return False
    return True
