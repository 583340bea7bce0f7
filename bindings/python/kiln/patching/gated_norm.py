"""Gated RMSNorms: ``rms_norm(x) * weight * act(gate)``, or ``rms_norm(x * act(gate)) * weight``.

The linear-attention layers of Qwen3-Next and Qwen3.5 (three in four of their layers), of
OLMo's hybrid and of Kimi Linear and GLM-5 Next close each value head with the first form
(``self.norm(core_attn_out, z)``): SiLU of the gate for the first, sigmoid for the last two.
The Mamba-2 mixers of Bamba, Granite 4.0's hybrids, Falcon-H1, Nemotron-H and Mamba-2 itself
close their scan with the second (``self.norm(scan_output, gate)``), over the whole row or over
groups of ``group_size`` channels (each group a row of the kernel, the weight applied after,
as the module applies it).
Eager, each step (the fp32 casts, the squares and their mean, the scaling, the weight, the
activation, the product) is a kernel over the rows; ``kiln.rms_norm_gated`` reads x and the
gate once and writes the output once.

A module is a candidate by its attributes (a norm's: a leaf with ``variance_epsilon`` or
``eps`` and a 1-D ``weight`` or none) and a forward whose second parameter is the gate
(``gate``, ``g`` or ``z``). It is matched by what its forward computes on a random probe
(:mod:`.detect`), each activation and order tried; a norm module that computes neither (called
with a gate) is patched, if at all, as the plain norm it computes when called without one.
"""

import inspect
from typing import Callable, Optional, Union

import torch

from .. import norm_ops
from . import detect
from .forwards import kiln_can_take, norm_eps

_GATE_NAMES = ("gate", "g", "z")
ACTIVATIONS = ("silu", "sigmoid")  # kiln.rms_norm_gated's, as the modules name them


def _gate_parameter(forward: Callable) -> Optional[str]:
    """The name of the forward's second parameter where it is the gate, else None."""
    try:
        parameters = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2 or positional[1].name not in _GATE_NAMES:
        return None
    return positional[1].name


def candidate(module: torch.nn.Module) -> bool:
    return detect.norm_candidate(module) and _gate_parameter(module.forward) is not None


def rms_norm_gated(activation: str, norm_before_gate: bool = True) -> Callable:
    """The replacement forward's factory: one ``kiln.rms_norm_gated`` call where x, the gate
    and the weight share a dtype and a device and no gradient is wanted (the op has no
    backward); the original forward everywhere else. A module that gates first over groups
    of ``group_size`` channels (Mamba-2's) normalises each group as a row and multiplies by
    its weight after."""

    def factory(module: torch.nn.Module, original: Callable) -> Callable:
        gate_name = _gate_parameter(original)
        group = getattr(module, "group_size", None)

        def forward(*args, **kwargs):
            if len(args) == 2 and not kwargs:
                x, gate = args
            elif len(args) == 1 and set(kwargs) == {gate_name}:
                x, gate = args[0], kwargs[gate_name]
            else:
                return original(*args, **kwargs)
            weight = getattr(module, "weight", None)
            if not isinstance(x, torch.Tensor) or not isinstance(gate, torch.Tensor) or gate.shape != x.shape:
                return original(*args, **kwargs)
            tensors = (x, gate) if weight is None else (x, gate, weight)
            if not kiln_can_take(*tensors):
                return original(*args, **kwargs)
            eps, hidden = norm_eps(module, x), x.shape[-1]
            if norm_before_gate or not isinstance(group, int) or group == hidden:
                return norm_ops.rms_norm_gated(x, gate, weight, eps, activation, norm_before_gate)
            if group <= 0 or hidden % group != 0:
                return original(*args, **kwargs)
            groups = (*x.shape[:-1], hidden // group, group)
            out = norm_ops.rms_norm_gated(x.reshape(groups), gate.reshape(groups), None, eps, activation, False)
            out = out.reshape(x.shape)
            return out if weight is None else weight * out

        return forward

    return factory


def classify(module: torch.nn.Module, original: Callable) -> Union[detect.Match, detect.NoMatch]:
    """The gated form; where the module computes another (Mamba-2's), what it computes called
    without a gate, if that is one of kiln's norms (calls with a gate then keep the original)."""
    key = detect.forward_key(module, original)
    gated = detect.remembered(key and ("gated norm", key), lambda: _classify(module, original))
    if isinstance(gated, detect.Match):
        return gated
    plain = detect.classify_norm(module, original)
    return plain if isinstance(plain, detect.Match) else gated


def _classify(module: torch.nn.Module, original: Callable) -> Union[detect.Match, detect.NoMatch]:
    if getattr(module, "bias", None) is not None:
        return detect.NoMatch("gated norm", "it has a bias; kiln's gated RMSNorm has none")
    weight = getattr(module, "weight", None)
    generator = torch.Generator().manual_seed(0)
    swap = {}
    if weight is None:
        hidden, dtypes = 64, detect._PROBE_DTYPES
    else:
        hidden = weight.shape[0]
        swap["weight"] = (torch.randn(hidden, generator=generator) * 0.5 + 1.0).to(weight.dtype)
        dtypes = (weight.dtype,) + tuple(d for d in detect._PROBE_DTYPES if d != weight.dtype)
    inputs = detect._probe_inputs(hidden, dtypes, generator)
    gates = [2.0 * torch.randn(x.shape, generator=generator).to(x.dtype) for x in inputs]
    by_input = {id(x): g for x, g in zip(inputs, gates)}
    reasons = []
    with torch.no_grad(), detect._Swapped(module, params=swap):
        for norm_before_gate in (True, False):
            for activation in ACTIVATIONS:
                replacement = rms_norm_gated(activation, norm_before_gate)(module, original)
                why = detect._compare(lambda x: original(x, by_input[id(x)]),
                                      lambda x: replacement(x, by_input[id(x)]), inputs)
                order = "after the norm" if norm_before_gate else "before the norm"
                if why is None:
                    group = getattr(module, "group_size", None)
                    if not norm_before_gate and isinstance(group, int) and group != hidden:
                        order += f", over groups of {group}"
                    return detect.Match(f"rms_norm_gated ({activation} of the gate, {order})", "rms_norm_gated",
                                        rms_norm_gated(activation, norm_before_gate), family="rms_norm")
                if why.startswith("its forward fails"):
                    return detect.NoMatch("gated norm", why)
                reasons.append(f"with {activation} {order}: {why}")
    return detect.NoMatch("gated norm", "does not compute rms_norm(x) * weight * act(gate) nor "
                                        "rms_norm(x * act(gate)) * weight: " + "; ".join(reasons))
