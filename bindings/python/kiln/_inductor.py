"""Every ``torch.ops.kiln`` overload registered with Inductor as an explicit fallback.

Inductor lowers a custom op it has no lowering for through an implicit fallback, and first
logs the op with its IR arguments formatted as text, at any log level (``GraphLowering.
call_function``). That text writes out each argument's inputs in full, once per path that
reaches them, so it grows about 16-fold per transformer block for an op first met late in a
model: whole-model ``torch.compile`` of a patched LTX-Video (its output LayerNorm comes after
28 blocks) never finished its first call, where each block compiled on its own took seconds.
Registering the fallback up front, with the layout constraint the implicit path would pick,
gives the same generated code and skips that message.

``torch._inductor`` takes a second or more to import, so ``import kiln`` does not import
it: the fallbacks are registered when it is first imported (or at once, if it already is).
"""

import importlib.abc
import importlib.util
import logging
import sys

import torch

_LOWERING = "torch._inductor.lowering"
_log = logging.getLogger(__name__)


def kiln_overloads():
    """Every overload of every op in the ``kiln`` namespace, from the dispatcher's schemas."""
    overloads = []
    for schema in torch._C._jit_get_all_schemas():
        if schema.name.startswith("kiln::"):
            packet = getattr(torch.ops.kiln, schema.name.split("::", 1)[1])
            overloads.append(getattr(packet, schema.overload_name or "default"))
    return overloads


def register_fallbacks(lowering=None) -> list:
    """Registers kiln's overloads that Inductor has no lowering for as fallbacks; returns
    their names. Safe to call again (registered ones are skipped)."""
    if lowering is None:
        lowering = sys.modules.get(_LOWERING)
        if lowering is None:
            return []
    registered = []
    try:
        for op in kiln_overloads():
            if op in lowering.lowerings:
                continue
            tag = lowering.get_layout_constraint_tag(op, with_default=True)
            lowering.make_fallback(op, layout_constraint=lowering.tag_to_layout_constraint(tag),
                                   warn=False)
            registered.append(str(op))
    except (AttributeError, TypeError) as error:  # an Inductor without these helpers
        _log.warning("kiln: could not register Inductor fallbacks for kiln's ops (%s); "
                     "Inductor will use its implicit fallbacks", error)
    return registered


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds torch._inductor.lowering as the other finders do, and registers kiln's
    fallbacks once the module has run. One-shot: it leaves sys.meta_path when it fires."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _LOWERING:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            register_fallbacks(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Registers the fallbacks now if Inductor's lowerings are loaded, else when they are."""
    if _LOWERING in sys.modules:
        register_fallbacks()
    elif not any(isinstance(finder, _RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
