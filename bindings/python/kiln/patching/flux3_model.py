"""FLUX.3's transformer forward (diffusers' ``Flux3Transformer2DModel.forward``) with its image
tokens' activated timestep embedding kept one row a sample.

The forward expands the image tokens' timestep embedding to every token and then activates it
(``F.silu`` of [B, S, D]), which makes S identical rows in a tensor of their own; its image
modulation heads then project all of them. kiln's copy of the forward (recompiled from its
source, :mod:`.source_rewrite`) calls :func:`expanded_silu` where it calls ``F.silu``: the
activation of one row a sample of an expanded tensor, expanded as its input was (elementwise,
so the same values), which the modulation heads (:func:`.flux3_block.flux3_modulation`) and the
blocks (:func:`.flux3_block.per_sample`) then read one row a sample. Everything else is the
forward's own code; a forward whose source differs from the code that runs is left as it is.
"""

import ast
import types
import weakref
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F

from . import source_rewrite
from .detect import NoMatch
from .detect_dit import DitMatch
from .flux3_block import per_sample

SILU_GLOBAL = "_kiln_expanded_silu"
KIND = "flux.3 transformer (timestep embeddings activated one row a sample)"


def expanded_silu(x, inplace: bool = False):
    """``F.silu(x)``, computed on one row a sample where x [B, S, D] is expanded over S."""
    if not inplace and isinstance(x, torch.Tensor) and per_sample(x) is not x:
        return F.silu(x[:, :1]).expand_as(x)
    return F.silu(x, inplace=inplace)


def candidate(module: torch.nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Module)
               for n in ("early_stream_modulations", "single_stream_modulations", "norm_out")) \
        and hasattr(module, "time_proj")


def _silu_calls(fn: ast.FunctionDef, scope: dict) -> list:
    """The forward's calls ``<functional>.silu(x)`` (one positional argument, ``<functional>`` a
    name bound to torch.nn.functional in its module)."""
    return [node for node in ast.walk(fn)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "silu"
            and isinstance(node.func.value, ast.Name) and scope.get(node.func.value.id) is F
            and len(node.args) == 1 and not node.keywords and not isinstance(node.args[0], ast.Starred)]


def rewritten_code(function: types.FunctionType, wrapped: bool) -> Optional[types.CodeType]:
    parsed = source_rewrite.parsed_forward(function, wrapped=wrapped)
    if parsed is None:
        return None
    tree, fn = parsed
    if not _silu_calls(fn, function.__globals__):
        return None

    def edit(fn: ast.FunctionDef) -> None:
        for call in _silu_calls(fn, function.__globals__):
            call.func = ast.Name(id=SILU_GLOBAL, ctx=ast.Load())

    return source_rewrite.recompiled(function, tree, fn, edit)


# One kiln copy per class forward, shared by every model of that class.
_COPIES: "weakref.WeakKeyDictionary[types.FunctionType, dict]" = weakref.WeakKeyDictionary()


def with_expanded_silu(function: types.FunctionType) -> Optional[types.FunctionType]:
    """The forward with its ``F.silu`` calls as :func:`expanded_silu`, or None where its source
    is not rewritable. The copy's globals are brought up to date with its module's at each call."""
    copies = _COPIES.setdefault(function, {})

    def make():
        parts = source_rewrite.editable(function)
        if parts is None:
            return None
        inner, around = parts
        code = rewritten_code(inner, wrapped=inner is not function)
        if code is None:
            return None
        scope = source_rewrite.module_scope(inner, "flux3-expanded-silu")
        own = {SILU_GLOBAL: expanded_silu}
        return around(source_rewrite.function_from(code, scope, inner)), scope, inner, own

    return source_rewrite.kept(copies, "expanded-silu", make)


def classify(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    function = type(module).forward
    if getattr(original, "__func__", None) is not function:
        return NoMatch("transformer", "its forward is not its class's own")
    copy = with_expanded_silu(function)
    if copy is None:
        return NoMatch("transformer", "its forward calls no F.silu kiln can edit, or no longer matches its source")

    def factory(module: torch.nn.Module, original: Callable) -> Callable:
        return source_rewrite.bound_forward(copy, module, function)

    return DitMatch(KIND, "none", "adaln", factory)


CANDIDATES = ((candidate, classify),)
