"""Swapping a module's forward on the instance, and putting the original back.

accelerate's hooks (``add_hook_to_module``, ``enable_model_cpu_offload``) keep the
module's forward as ``module._old_forward`` and set ``module.forward`` to a wrapper that
calls it between the hook's pre- and post-forward. diffusers' hooks (its ``HookRegistry``:
``enable_group_offload``, ``enable_layerwise_casting``, ``enable_cache``) keep it in the
registry's first function reference, which the chain of wrappers calls last. Where either
is there, the replacement goes in that place (:class:`Slot`): inside the hooks, which still
move the weights and inputs around it, or skip it from a cache. A hook added after the patch
takes the patched forward as its inner one the same way, and ``unpatch`` finds it there.
"""

import contextlib
import copy
import warnings
from dataclasses import dataclass, replace as _with
from typing import Callable, Optional

import torch

from . import forwards

_STATE = "_kiln_patch"
_HOOKED = "_old_forward"


@dataclass(frozen=True)
class PatchState:
    original: Callable  # the inner forward the patch replaced (bound to the module)
    patched: Callable
    kind: str
    op: str
    # The module had no forward of its own: unpatched, it runs its class's forward again,
    # whatever that is by then (FSDP2 swaps a module's class for a subclass of its own).
    class_forward: bool = False
    # What made ``patched``: (module, original forward) -> patched forward.
    factory: Optional[Callable] = None
    # The method replaced: the forward, or another method set on the instance (see
    # install_method).
    method: str = "forward"

    def __deepcopy__(self, memo):
        """A deep copy of a patched module (an EMA or reference copy of a model) gets a patched
        forward made for the copy: the original's reads the original's weights. The state
        comes before the forward in the module's dictionary (see :func:`install`), so the
        copy's forward is this one, found in ``memo``."""
        original = copy.deepcopy(self.original, memo)
        module = getattr(original, "__self__", None)
        if self.factory is None or not isinstance(module, torch.nn.Module):
            return _with(self, original=original, patched=copy.deepcopy(self.patched, memo))
        # The copy's attributes are not there yet: a factory reads them at call time only.
        patched = self.factory(module, original)
        memo[id(self.patched)] = patched
        return _with(self, original=original, patched=patched)


@dataclass(frozen=True, eq=False)
class Slot:
    """Where a module keeps the forward that computes its result: an entry of its dictionary
    (``forward``, or accelerate's ``_old_forward``) or an attribute of the function reference
    diffusers' hooks call it through."""

    holder: object
    name: str

    def get(self) -> Optional[Callable]:
        if isinstance(self.holder, dict):
            return self.holder.get(self.name)
        return getattr(self.holder, self.name)

    def set(self, forward: Callable) -> None:
        if isinstance(self.holder, dict):
            self.holder[self.name] = forward
        else:
            setattr(self.holder, self.name, forward)


def _diffusers_wrapper(forward: Callable) -> bool:
    """Whether ``forward`` is the wrapper diffusers' HookRegistry set as a module's forward."""
    func = getattr(forward, "func", None)
    return "HookRegistry." in getattr(func, "__qualname__", "")


def _diffusers_slot(module: torch.nn.Module) -> Optional[Slot]:
    """The place beneath the module's diffusers hooks, if it has any: the first hook's
    reference keeps the forward the chain calls last (``original_forward`` where that hook
    replaces the call, as a cache's does, else ``forward``); removing the hooks puts it back."""
    refs = getattr(module.__dict__.get("_diffusers_hook"), "_fn_refs", None)
    if not refs:
        return None
    first = refs[0]
    return Slot(first, "original_forward" if getattr(first, "original_forward", None) is not None else "forward")


def inner_slot(module: torch.nn.Module) -> Slot:
    """Where the forward that computes the module's result is: beneath accelerate's hook or
    diffusers' hooks, whichever was added first, or the module's own ``forward``."""
    own = module.__dict__
    diffusers = _diffusers_slot(module)
    if _HOOKED in own and (diffusers is None or not _diffusers_wrapper(own[_HOOKED])):
        return Slot(own, _HOOKED)
    return diffusers if diffusers is not None else Slot(own, "forward")


def inner_forward(module: torch.nn.Module) -> Callable:
    """The forward that computes the module's result: the one inside any hook."""
    forward = inner_slot(module).get()
    return forward if forward is not None else module.forward


def _hooked(module: torch.nn.Module) -> bool:
    return _HOOKED in module.__dict__ or forwards.diffusers_hooks(module)


@contextlib.contextmanager
def hooks_bypassed(module: torch.nn.Module):
    """While a probe runs ``module`` on stand-in weights and CPU tensors: its hooked
    descendants run their inner forwards. An offloading hook would bring the real weights to
    the GPU in place of the stand-ins, and a casting hook cast them to its storage dtype."""
    bypassed = [(m, m.__dict__.get("forward")) for m in module.modules() if m is not module and _hooked(m)]
    for m, _ in bypassed:
        m.__dict__["forward"] = inner_forward(m)
    try:
        yield
    finally:
        for m, hooked in bypassed:
            if hooked is None:
                m.__dict__.pop("forward", None)
            else:
                m.__dict__["forward"] = hooked


def state_of(module: torch.nn.Module):
    """The module's PatchState or ProcessorState, or None."""
    return module.__dict__.get(_STATE)


def original_forward(module: torch.nn.Module) -> Callable:
    """The forward the module computed before any kiln patch."""
    state = state_of(module)
    return state.original if isinstance(state, PatchState) and state.method == "forward" else inner_forward(module)


def runs_as_classified(module: torch.nn.Module, forward: Callable) -> bool:
    """Whether a module another patch calls computes what was classified: its class's forward
    is still ``forward`` (the one probed) and its instance forward is its own or kiln's, with
    no hook around it."""
    if type(module).forward is not forward or forwards.any_hooks(module):
        return False
    own = module.__dict__.get("forward")
    state = state_of(module)
    return own is None or (isinstance(state, PatchState) and own is state.patched)


def install(module: torch.nn.Module, original: Callable, factory: Callable, kind: str, op: str,
            method: str = "forward") -> None:
    """Sets ``factory(module, original)`` as the module's (inner) forward, or as another
    ``method`` of it (see install_method)."""
    if method != "forward":
        install_method(module, method, factory, kind, op)
        return
    slot = inner_slot(module)
    own = isinstance(slot.holder, dict) and slot.name == "forward"
    class_forward = own and "forward" not in module.__dict__ and _is_class_forward(module, original)
    patched = factory(module, original)
    # The state before the forward in the dictionary, which a deep copy walks in order.
    if isinstance(slot.holder, dict):
        module.__dict__.pop(slot.name, None)
    module.__dict__[_STATE] = PatchState(original, patched, kind, op, class_forward, factory)
    slot.set(patched)


def install_method(module: torch.nn.Module, method: str, factory: Callable, kind: str, op: str) -> None:
    """Sets ``factory(module, original)`` as the module's ``method`` on the instance (original:
    the class's method bound to the module), which the module's own forward calls; the forward
    stays the module's, inside any hook."""
    original = getattr(type(module), method).__get__(module)
    patched = factory(module, original)
    # The state before the method in the dictionary, which a deep copy walks in order.
    module.__dict__.pop(method, None)
    module.__dict__[_STATE] = PatchState(original, patched, kind, op, factory=factory, method=method)
    module.__dict__[method] = patched


@dataclass(frozen=True)
class ProcessorState:
    """A diffusers attention module whose ``processor`` kiln replaced (the module's forward
    stays its own: it calls whatever processor is set, inside any hook)."""
    original: object
    patched: object
    kind: str
    op: str


def install_processor(module: torch.nn.Module, patched: object, kind: str, op: str) -> None:
    original = module.processor
    _set_processor(module, patched)
    module.__dict__[_STATE] = ProcessorState(original, patched, kind, op)


def _set_processor(module: torch.nn.Module, processor: object) -> None:
    setter = getattr(module, "set_processor", None)
    if callable(setter):
        setter(processor)
    else:
        module.processor = processor


def _uninstall_processor(module: torch.nn.Module, state: ProcessorState, path: str) -> bool:
    if getattr(module, "processor", None) is not state.patched:
        # Someone set another processor since: theirs stays, and the patch is forgotten.
        warnings.warn(f"kiln.unpatch: {path or '<model>'}: its attention processor was replaced "
                      "after kiln.patch; left as it is", stacklevel=4)
        return False
    _set_processor(module, state.original)
    return True


def _is_class_forward(module: torch.nn.Module, fn: Callable) -> bool:
    return getattr(fn, "__self__", None) is module and getattr(fn, "__func__", None) is type(module).forward


def uninstall(module: torch.nn.Module, path: str) -> bool:
    """Puts the original forward back wherever the patched one is now; False if the
    module was not patched (or its patched forward could not be found)."""
    state = module.__dict__.pop(_STATE, None)
    if state is None:
        return False
    module.__dict__.pop(forwards.KEPT_WEIGHT, None)
    module.__dict__.pop("_kiln_probed", None)  # probed.py's mark, for a fused op of another module
    forwards.forget_activation(module)
    if isinstance(state, ProcessorState):
        return _uninstall_processor(module, state, path)
    if state.method != "forward":
        if module.__dict__.get(state.method) is not state.patched:
            # Someone set another method since: theirs stays, and the patch is forgotten.
            warnings.warn(f"kiln.unpatch: {path or '<model>'}: its {state.method} was replaced after "
                          "kiln.patch; left as it is", stacklevel=3)
            return False
        del module.__dict__[state.method]  # the class's method again
        return True
    restored = False
    beneath = _diffusers_slot(module)
    if beneath is not None and beneath.get() is state.patched:
        beneath.set(state.original)
        restored = True
    if module.__dict__.get(_HOOKED) is state.patched:
        module.__dict__[_HOOKED] = state.original
        restored = True
    if module.__dict__.get("forward") is state.patched:
        if state.class_forward or _is_class_forward(module, state.original):
            del module.__dict__["forward"]  # the class's own forward again, as before
        else:
            module.__dict__["forward"] = state.original
        restored = True
    if not restored:
        module.__dict__[_STATE] = state
        warnings.warn(f"kiln.unpatch: {path or '<model>'}: its forward was wrapped by something "
                      "other than an accelerate or diffusers hook after kiln.patch; left as it is", stacklevel=3)
        return False
    return True
