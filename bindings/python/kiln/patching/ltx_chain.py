"""The seam between consecutive LTX-Video blocks: block i ends with ``h + ff * gate_mlp``
and block i + 1 starts with the AdaLN of that h (its norm1, modulated). Where kiln patched
both, block i computes the two in one ``kiln.gated_adaln`` pass (h and ff read once, where
the two kernels read h twice) and hands the normalised output over; block i + 1 takes it
only if it is called with that very h and temb, unchanged, and computes its own otherwise.

A chain is the run of consecutive patched blocks in one ``nn.ModuleList``, linked by
:func:`link` when the model is patched. No hand-over happens while compiling (each compiled
region computes its own) or where a hook runs around the next block (it may change its
inputs or move its weights), and at most one is held at a time: any block of the chain
that runs clears it.
"""

import weakref
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from . import replace
from .forwards import any_hooks

_CHAINS = weakref.WeakKeyDictionary()  # block -> (_Chain, its index)


@dataclass
class _HandOver:
    receiver: torch.nn.Module
    h: torch.Tensor
    temb: torch.Tensor
    versions: tuple
    norm: torch.Tensor


class _Chain:
    def __init__(self, blocks):
        self.blocks = [weakref.ref(b) for b in blocks]
        self.held: Optional[_HandOver] = None


def link(model: torch.nn.Module, is_patched_block: Callable[[torch.nn.Module], bool]) -> None:
    """Chains the runs of consecutive patched blocks in each ModuleList of ``model``."""
    for modules in model.modules():
        if not isinstance(modules, torch.nn.ModuleList):
            continue
        run = []
        for m in list(modules) + [None]:
            if m is not None and is_patched_block(m):
                run.append(m)
                continue
            if len(run) > 1:
                chain = _Chain(run)
                for i, block in enumerate(run):
                    _CHAINS[block] = (chain, i)
            run = []


def unlink(model: torch.nn.Module) -> None:
    for m in model.modules():
        _CHAINS.pop(m, None)


def successor(block: torch.nn.Module) -> Optional[torch.nn.Module]:
    """The next block of ``block``'s chain, where a hand-over to it may happen now."""
    if torch.compiler.is_compiling():
        return None
    entry = _CHAINS.get(block)
    if entry is None:
        return None
    chain, i = entry
    nxt = chain.blocks[i + 1]() if i + 1 < len(chain.blocks) else None
    if nxt is None or replace.state_of(nxt) is None or any_hooks(nxt):
        chain.held = None
        return None
    return nxt


def hand_over(block: torch.nn.Module, receiver: torch.nn.Module, h: torch.Tensor, temb: torch.Tensor,
              norm: torch.Tensor) -> None:
    chain = _CHAINS[block][0]
    chain.held = _HandOver(receiver, h, temb, (h._version, temb._version), norm)


def take(block: torch.nn.Module, h: torch.Tensor, temb: torch.Tensor) -> Optional[torch.Tensor]:
    """The normalised output handed over to ``block`` for this h and temb, if any; clears
    what its chain holds either way."""
    if torch.compiler.is_compiling():
        return None
    entry = _CHAINS.get(block)
    if entry is None:
        return None
    chain = entry[0]
    held, chain.held = chain.held, None
    if held is None or held.receiver is not block or held.h is not h or held.temb is not temb:
        return None
    if (h._version, temb._version) != held.versions:
        return None
    return held.norm
