"""MoE experts that hold every expert's gate and up projections as one [E, H, 2I] parameter and
run them as batched matmuls over tokens already routed to each expert (Llama 4's
``Llama4TextExperts``: ``gate_up = bmm(x.view(E, -1, H), gate_up_proj)``, ``gate, up =
gate_up.chunk(2, dim=-1)``, ``bmm(up * act_fn(gate), down_proj)``). Every expert's rows are
gated at once: the split, the activation and the multiply read and write E x rows x 2I
elements in two kernels. kiln runs them as one ``kiln.swiglu`` (or ``kiln.geglu``) over the
packed product; the matmuls stay torch's, with the module's own parameters.

A candidate holds ``gate_up_proj`` and ``down_proj`` as 3-D tensors, an ``act_fn`` and no other
child, and has no ``_apply_gate`` (transformers' experts implementations, :mod:`.experts_gate`).
It is matched when its forward computes that on random probes (small stand-in parameters of
its hidden size), gate first or up first.
"""

from typing import Callable, Union

import torch

from . import detect
from .forwards import (PACKED_OPS, _single_tensor_call, forget_activation, gate_packed, kiln_can_take,
                       remember_activation, runs_probed_activation)


def _weights(module: torch.nn.Module):
    return getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)


def candidate(module: torch.nn.Module) -> bool:
    gate_up, down = _weights(module)
    return isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor) and gate_up.dim() == 3 \
        and down.dim() == 3 and callable(getattr(module, "act_fn", None)) \
        and not callable(getattr(type(module), "_apply_gate", None))


def bmm_experts(activation: str, up_first: bool) -> Callable:
    """The replacement forward's factory: ``activation`` is a key of ``forwards.ACTIVATIONS``;
    ``up_first`` says the packed product's first half is up."""
    def factory(module: torch.nn.Module, original: Callable) -> Callable:
        def forward(*args, **kwargs):
            if not _single_tensor_call(args, kwargs):
                return original(*args, **kwargs)
            x = args[0]
            gate_up_proj, down_proj = _weights(module)
            experts, hidden = gate_up_proj.shape[0], gate_up_proj.shape[1]
            if gate_up_proj.shape[2] % 2 != 0 or x.numel() % (experts * hidden) != 0 \
                    or not runs_probed_activation(module, module.act_fn) \
                    or not kiln_can_take(x, gate_up_proj, down_proj, differentiable=True):
                return original(*args, **kwargs)
            packed = torch.bmm(x.view(experts, -1, hidden), gate_up_proj)
            return torch.bmm(gate_packed(activation, packed, up_first), down_proj).view(-1, down_proj.shape[-1])

        return forward

    return factory


def _kind(activation: str, up_first: bool) -> str:
    op, approximate = PACKED_OPS[activation]
    form = " (tanh)" if approximate == "tanh" else ""
    return f"moe experts {op}{form} (batched matmuls, one packed gate_up, {'up' if up_first else 'gate'} first)"


def classify(module: torch.nn.Module, original: Callable) -> Union[detect.Match, detect.NoMatch]:
    others = detect.other_children(module, ("act_fn",))
    if others:
        return detect.NoMatch("moe experts", others)
    activation = detect._identify_activation(module.act_fn)
    if activation is None:
        return detect.NoMatch("moe experts", f"its act_fn ({type(module.act_fn).__name__}) is not SiLU or GELU "
                                             "on a probe")
    gate_up_proj, down_proj = _weights(module)
    dtype = gate_up_proj.dtype if gate_up_proj.is_floating_point() else torch.float32
    # The module's own hidden size (its forward may read it from an attribute), three experts
    # of a small width; the probe's 3 x 5 rows are five tokens an expert.
    experts, hidden, inner = 3, gate_up_proj.shape[1], 20
    generator = torch.Generator().manual_seed(0)
    params = {
        "gate_up_proj": (torch.randn(experts, hidden, 2 * inner, generator=generator) / hidden ** 0.5).to(dtype),
        "down_proj": (torch.randn(experts, inner, down_proj.shape[-1], generator=generator) / inner ** 0.5).to(dtype),
    }
    dtypes = (dtype,) + tuple(d for d in detect._PROBE_DTYPES if d != dtype)
    inputs = detect.with_large_values(detect._probe_inputs(hidden, dtypes, generator))
    reasons = []
    remember_activation(module, "act_fn")  # the replacement runs kiln's op only for it
    with torch.no_grad(), detect._Swapped(module, params=params):
        for up_first in (False, True):
            factory = bmm_experts(activation, up_first)
            why = detect._compare(original, factory(module, original), inputs,
                                  scale_of=lambda out: out.abs().max().item())
            if why is None:
                return detect.Match(_kind(activation, up_first), PACKED_OPS[activation][0], factory)
            reasons.append(why)
            if why.startswith("its forward fails"):
                break
    forget_activation(module)
    if len(reasons) == 1:
        return detect.NoMatch("moe experts", reasons[0])
    return detect.NoMatch("moe experts", f"does not compute bmm(up * act(gate), down_proj) of bmm(x, gate_up_proj)'s "
                                         f"halves, gate first ({reasons[0]}) or up first ({reasons[1]})")
