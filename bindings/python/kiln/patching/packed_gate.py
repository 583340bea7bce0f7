"""Gated activations whose gate and up halves come out of one projection.

transformers' packed MLPs (Phi-3 and Phi-4, GLM and GLM-4, Dia: ``gate, up =
gate_up_proj(x).chunk(2, dim=-1)``, then ``down_proj(up * activation_fn(gate))``) and
diffusers' ``GEGLU`` and ``SwiGLU`` (``h, gate = proj(x).chunk(2, dim=-1)``, then
``h * act(gate)``: the feed-forward of Stable Diffusion's and SDXL's transformer blocks, and
of Mochi's) split the projection's output into two strided views and run the activation and
the multiply as two kernels over them. kiln's ``swiglu`` and ``geglu`` read the packed
tensor as it is, with the order of its halves a parameter, so the split, the activation and
the multiply become one call; the projections stay the module's own. A module that is only
the activation of a packed tensor (FLUX.2's ``Flux2SwiGLU``: ``gate_fn(x[..., :half]) *
x[..., half:]``, its projection fused into the feed-forward's first linear, and its single
blocks' ``mlp_act_fn``) becomes the same one call, and so does a module of a ``proj_in`` and
a ``proj_out`` only whose forward gates proj_in's halves with a function of torch's (Stable
Audio 3's feed-forward: ``proj_out(h * F.silu(gate))``).

A module is a candidate by its attributes (a ``gate_up_proj`` and a ``down_proj`` child and
an ``activation_fn`` or ``act_fn``; or a ``proj`` Linear and a ``gelu`` or ``activation``
but no ``approximate``, which is diffusers' ``GELU``; or no parameters and one child, a
``gate_fn``, ``act_fn`` or ``activation_fn`` module; or ``proj_in`` and ``proj_out`` Linears only,
the first twice as wide as the second's input) and is matched by what its forward computes on a
random probe, each order of the halves tried (and, with no activation of its own, SiLU and both
GELUs: :mod:`.detect`).
"""

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from . import detect
from .forwards import (ACTIVATIONS, PACKED_OPS, _single_tensor_call, forget_activation, gate_packed, kiln_can_take,
                       remember_activation, runs_probed_activation)


@dataclass(frozen=True)
class Layout:
    """Where a module keeps its packed gate."""

    proj: Optional[str]  # the projection whose output holds both halves (None: the input does)
    down: Optional[str]  # the projection applied to the product, where the module has one
    # The attribute that applies the activation to the gate; None where the forward calls a
    # function of torch's (Stable Audio 3's F.silu), found by the probe.
    activation: Optional[str]


def layout_of(module: torch.nn.Module) -> Optional[Layout]:
    if detect.has_child(module, "gate_up_proj") and detect.has_child(module, "down_proj"):
        for name in ("activation_fn", "act_fn"):
            if callable(getattr(module, name, None)):
                return Layout("gate_up_proj", "down_proj", name)
        return None
    if isinstance(getattr(module, "proj", None), torch.nn.Linear) and not hasattr(module, "approximate"):
        for name in ("gelu", "activation"):
            if callable(getattr(module, name, None)):
                return Layout("proj", None, name)
    children = [name for name, _ in module.named_children()]
    if len(children) == 1 and children[0] in ("gate_fn", "act_fn", "activation_fn") \
            and next(module.parameters(), None) is None:
        return Layout(None, None, children[0])
    if children == ["proj_in", "proj_out"] and _packs_for(module.proj_in, module.proj_out):
        return Layout("proj_in", "proj_out", None)
    return None


def _packs_for(proj: torch.nn.Module, down: torch.nn.Module) -> bool:
    """Whether ``proj`` is a Linear whose output is twice ``down``'s Linear input."""
    return isinstance(proj, torch.nn.Linear) and isinstance(down, torch.nn.Linear) \
        and proj.out_features == 2 * down.in_features


def candidate(module: torch.nn.Module) -> bool:
    return layout_of(module) is not None


def packed_gate(layout: Layout, activation: str, up_first: bool) -> Callable:
    """The replacement forward's factory: ``activation`` is a key of
    ``forwards.ACTIVATIONS``; ``up_first`` says the projection's first half is up."""
    def factory(module: torch.nn.Module, original: Callable) -> Callable:
        def forward(*args, **kwargs):
            if not _single_tensor_call(args, kwargs):
                return original(*args, **kwargs)
            packed = args[0] if layout.proj is None else getattr(module, layout.proj)(args[0])
            act = ACTIVATIONS[activation] if layout.activation is None else getattr(module, layout.activation)
            if packed.shape[-1] % 2 == 0 and (layout.activation is None or runs_probed_activation(module, act)) \
                    and kiln_can_take(packed, differentiable=True):
                hidden = gate_packed(activation, packed, up_first)
            elif layout.proj is None:
                return original(*args, **kwargs)
            else:
                first, second = packed.chunk(2, dim=-1)
                gate, up = (second, first) if up_first else (first, second)
                hidden = up * act(gate)
            return hidden if layout.down is None else getattr(module, layout.down)(hidden)

        return forward

    return factory


def _kind(layout: Layout, activation: str, up_first: bool) -> str:
    op, approximate = PACKED_OPS[activation]
    form = " (tanh)" if approximate == "tanh" else ""
    if layout.down is not None:
        return f"mlp {op}{form}, one gate_up projection"
    if layout.proj is None:
        return f"{op}{form}, packed ({'up' if up_first else 'gate'} first)"
    return f"{op}{form}, one projection ({'up' if up_first else 'gate'} first)"


def classify(module: torch.nn.Module, original: Callable) -> Union[detect.Match, detect.NoMatch]:
    layout = layout_of(module)
    others = detect.other_children(module, (layout.proj, layout.down, layout.activation))
    if others:
        return detect.NoMatch("gated projection", others)
    if layout.activation is None:
        activations = tuple(ACTIVATIONS)  # the forward's own call: each tried on the probe
    else:
        act_fn = getattr(module, layout.activation)
        activations = (detect._identify_activation(act_fn),)
        if activations[0] is None:
            return detect.NoMatch("gated projection", f"its {layout.activation} ({type(act_fn).__name__}) is not "
                                                      "SiLU or GELU on a probe")
    generator = torch.Generator().manual_seed(0)
    hidden, inner = 24, 40
    children = {}
    if layout.proj is None:
        # Its input is the packed tensor itself.
        dtype, hidden = torch.float32, 2 * inner
    else:
        proj = getattr(module, layout.proj)
        dtype = detect.probe_dtype(proj)
        children[layout.proj] = detect.probe_linear(hidden, 2 * inner, proj, dtype, generator)
    if layout.down is not None:
        children[layout.down] = detect.probe_linear(inner, hidden, getattr(module, layout.down), dtype, generator)
    dtypes = (dtype,) + tuple(d for d in detect._PROBE_DTYPES if d != dtype)
    inputs = detect.with_large_values(detect._probe_inputs(hidden, dtypes, generator))
    # A down projection sums many rounded products: the bound scales with the output's size.
    scale_of = (lambda out: out.abs().max().item()) if layout.down is not None else (lambda out: 0.0)
    reasons = []
    if layout.activation is not None:
        remember_activation(module, layout.activation)  # the replacement runs kiln's op only for it
    with torch.no_grad(), detect._Swapped(module, children=children):
        for activation in activations:
            for up_first in (False, True):
                factory = packed_gate(layout, activation, up_first)
                why = detect._compare(original, factory(module, original), inputs, scale_of=scale_of)
                if why is None:
                    return detect.Match(_kind(layout, activation, up_first), PACKED_OPS[activation][0], factory)
                reasons.append(why)
                if why.startswith("its forward fails"):
                    break
            if reasons[-1].startswith("its forward fails"):
                break
    forget_activation(module)
    if len(reasons) == 1:
        return detect.NoMatch("gated projection", reasons[0])
    product = "up * act(gate)" if layout.down is None else f"{layout.down}(up * act(gate))"
    packed = "x" if layout.proj is None else f"{layout.proj}(x)"
    acts = " with SiLU or GELU" if layout.activation is None else ""
    return detect.NoMatch("gated projection", f"does not compute {product} of {packed}'s halves{acts}, gate "
                                              f"first ({reasons[0]}) or up first ({reasons[1]})")
