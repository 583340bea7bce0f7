"""Runs of consecutive modules in a model's ``nn.ModuleList``s (the blocks or layers a model
calls one after the other) where each may hand a result it computed for the next one over:
:mod:`.dit_block_chain` (LTX-Video's and Wan's blocks) and :mod:`.residual_norm_chain` (decoder layers).

At most one result is held a chain, and the next module of the chain that looks for one
clears it, whether it takes it or not. Nothing is handed over while compiling: each compiled
region computes its own.
"""

import weakref
from typing import Callable, Iterator, List, Optional

import torch


def runs(model: torch.nn.Module, member: Callable[[torch.nn.Module], bool]) -> Iterator[List[torch.nn.Module]]:
    """Each run of two or more consecutive ``member`` modules in each ModuleList of ``model``."""
    for modules in model.modules():
        if not isinstance(modules, torch.nn.ModuleList):
            continue
        run = []
        for m in list(modules) + [None]:
            if m is not None and member(m):
                run.append(m)
                continue
            if len(run) > 1:
                yield run
            run = []


class _Chain:
    def __init__(self, modules):
        self.modules = [weakref.ref(m) for m in modules]
        self.held = None  # (receiver, what it is handed)


class Chains:
    """The chains of one kind of hand-over, by module."""

    def __init__(self):
        self._of: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()

    def link(self, model: torch.nn.Module, member: Callable[[torch.nn.Module], bool]) -> None:
        for run in runs(model, member):
            chain = _Chain(run)
            for i, m in enumerate(run):
                self._of[m] = (chain, i)

    def unlink(self, model: torch.nn.Module) -> None:
        for m in model.modules():
            self._of.pop(m, None)

    def successor(self, module: torch.nn.Module) -> Optional[torch.nn.Module]:
        """The module after ``module`` in its chain (None while compiling, or at its end)."""
        if torch.compiler.is_compiling():
            return None
        found = self._of.get(module)
        if found is None:
            return None
        chain, i = found
        return chain.modules[i + 1]() if i + 1 < len(chain.modules) else None

    def hold(self, module: torch.nn.Module, receiver: torch.nn.Module, handed) -> None:
        """Holds ``handed`` for ``receiver`` in ``module``'s chain, in place of what it held."""
        self._of[module][0].held = (receiver, handed)

    def drop(self, module: torch.nn.Module) -> None:
        found = self._of.get(module)
        if found is not None:
            found[0].held = None

    def take(self, receiver: torch.nn.Module):
        """What ``receiver``'s chain holds for it, if anything; clears what it holds either way
        (None while compiling)."""
        if torch.compiler.is_compiling():
            return None
        found = self._of.get(receiver)
        if found is None:
            return None
        chain = found[0]
        held, chain.held = chain.held, None
        return held[1] if held is not None and held[0] is receiver else None
