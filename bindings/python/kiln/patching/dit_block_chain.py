"""The seam between consecutive diffusion-transformer blocks (LTX-Video's, Wan's): block i
ends with ``h + ff * gate_mlp`` and block i + 1 starts with the AdaLN of that h (its norm1,
modulated). Where kiln patched
both, block i computes the two in one ``kiln.gated_adaln`` pass (h and ff read once, where
the two kernels read h twice) and hands the normalised output over; block i + 1 takes it
only if it is called with that very h and temb, unchanged, and computes its own otherwise.

A chain is the run of consecutive patched blocks in one ``nn.ModuleList``, linked by
:func:`link` when the model is patched. No hand-over happens while compiling (each compiled
region computes its own) or where a hook runs around the next block (it may change its
inputs or move its weights), and at most one is held at a time: any block of the chain
that runs clears it.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from . import replace
from .forwards import any_hooks
from .hand_over import Chains

_CHAINS = Chains()


@dataclass
class _HandOver:
    h: torch.Tensor
    temb: torch.Tensor
    versions: tuple
    norm: torch.Tensor


def link(model: torch.nn.Module, is_patched_block: Callable[[torch.nn.Module], bool]) -> None:
    """Chains the runs of consecutive patched blocks in each ModuleList of ``model``."""
    _CHAINS.link(model, is_patched_block)


def unlink(model: torch.nn.Module) -> None:
    _CHAINS.unlink(model)


def successor(block: torch.nn.Module, h: torch.Tensor, temb: torch.Tensor) -> Optional[torch.nn.Module]:
    """The next block of ``block``'s chain, where a hand-over of this h and temb to it may
    happen now: not for inference tensors (``torch.inference_mode``), which keep no version
    counter to show that they were not changed in between."""
    if torch.compiler.is_compiling():
        return None
    if h.is_inference() or temb.is_inference():
        _CHAINS.drop(block)
        return None
    nxt = _CHAINS.successor(block)
    if nxt is None or replace.state_of(nxt) is None or any_hooks(nxt):
        _CHAINS.drop(block)
        return None
    return nxt


def hand_over(block: torch.nn.Module, receiver: torch.nn.Module, h: torch.Tensor, temb: torch.Tensor,
              norm: torch.Tensor) -> None:
    _CHAINS.hold(block, receiver, _HandOver(h, temb, (h._version, temb._version), norm))


def take(block: torch.nn.Module, h: torch.Tensor, temb: torch.Tensor) -> Optional[torch.Tensor]:
    """The normalised output handed over to ``block`` for this h and temb, if any; clears
    what its chain holds either way."""
    held = _CHAINS.take(block)
    if held is None or held.h is not h or held.temb is not temb:
        return None
    if (h._version, temb._version) != held.versions:
        return None
    return held.norm
