"""The seam between consecutive decoder layers: layer i ends with its last residual add,

    hidden_states = residual + hidden_states
    return hidden_states

and layer i + 1 starts by normalising that sum,

    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)

Where kiln rewrote both (:mod:`.residual_norm_layer`), layer i computes the sum and layer
i + 1's norm of it in one ``kiln.fused_add_rms_norm`` and hands the normalised rows over;
layer i + 1 takes them only if it is called with that very sum, unchanged, and its norm is the
one they were made with, weight unchanged; it computes its own otherwise.

A chain is a run of consecutive rewritten layers in one ``nn.ModuleList``, linked by
:func:`link` when the model is patched. No hand-over happens while compiling (Inductor fuses
the add and the norm itself), where autograd records (a checkpointed layer's recomputation
would hand over to no one), for inference tensors (which keep no version to show a change), or
where a hook runs around either layer or the norm; at most one is held at a time, and any layer
of the chain that starts clears it.
"""

import weakref
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from . import replace
from .forwards import any_hooks
from .hand_over import Chains
from .probed import rule_of


def versions(*tensors) -> Optional[Tuple[int, ...]]:
    """The tensors' version counters (-1 where there is no tensor), or None where one has
    none to read (an inference tensor: an in-place change to it would go unseen)."""
    try:
        return tuple(t._version if isinstance(t, torch.Tensor) else -1 for t in tensors)
    except RuntimeError:
        return None


@dataclass
class _HandOver:
    norm: torch.nn.Module
    total: torch.Tensor
    versions: Tuple[int, ...]
    weight: Optional[torch.Tensor]
    normed: torch.Tensor


_CHAINS = Chains()
# layer -> the attribute name of the norm its forward starts with
_ENTRIES: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()


def register(layer: torch.nn.Module, entry: Optional[str]) -> None:
    """Records the attribute name of the patched layer's first norm (None: it starts
    otherwise, and takes nothing)."""
    if entry is None:
        _ENTRIES.pop(layer, None)
    else:
        _ENTRIES[layer] = entry


def link(model: torch.nn.Module) -> None:
    """Chains the runs of consecutive patched layers with a first norm in each ModuleList of
    ``model``."""
    _CHAINS.link(model, lambda m: m in _ENTRIES and replace.state_of(m) is not None)


def unlink(model: torch.nn.Module) -> None:
    _CHAINS.unlink(model)
    for m in model.modules():
        _ENTRIES.pop(m, None)


def receiver(layer: torch.nn.Module) -> Optional[Tuple[torch.nn.Module, torch.nn.Module, str]]:
    """(the next layer of ``layer``'s chain, its first norm, the rule of that norm's weight),
    where a hand-over to it may happen now: not compiling, no hook on either layer (one on
    ``layer`` may change its output), the next layer still patched, its norm running as
    probed."""
    nxt = _CHAINS.successor(layer)
    entry = _ENTRIES.get(nxt) if nxt is not None else None
    if entry is None:
        return None
    state = replace.state_of(nxt)
    if not isinstance(state, replace.PatchState) or replace.inner_forward(nxt) is not state.patched \
            or any_hooks(nxt) or any_hooks(layer):
        return None
    norm = getattr(nxt, entry, None)
    rule = rule_of(norm)
    return None if rule is None else (nxt, norm, rule)


def hand_over(layer: torch.nn.Module, nxt: torch.nn.Module, norm: torch.nn.Module, total: torch.Tensor,
              normed: torch.Tensor) -> bool:
    """Holds ``normed`` for ``nxt``; False where the sum's or the weight's changes could not be
    seen (inference tensors), and nothing is held."""
    weight = getattr(norm, "weight", None)
    seen = versions(total, weight)
    if seen is None:
        return False
    _CHAINS.hold(layer, nxt, _HandOver(norm, total, seen, weight, normed))
    return True


def take(layer: torch.nn.Module, norm: torch.nn.Module, hidden: torch.Tensor) -> Optional[torch.Tensor]:
    """The rows of ``norm(hidden)`` handed over to ``layer``, if they were made of this very
    tensor, unchanged, by this norm with this weight, unchanged; clears what the chain holds
    either way."""
    held = _CHAINS.take(layer)
    if held is None or held.norm is not norm or held.total is not hidden:
        return None
    weight = getattr(norm, "weight", None)
    if weight is not held.weight or versions(hidden, weight) != held.versions or rule_of(norm) is None:
        return None
    return held.normed
