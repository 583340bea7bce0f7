"""The two-layer GELU MLPs of transformers' vision towers and encoders: ``fc2(act(fc1(x)))``
(SigLIP and SigLIP 2, so Gemma 3's, PaliGemma's, SmolVLM's and LLaVA-OneVision's towers; InternVL,
Idefics3, Mllama) and ``linear_fc2(act_fn(linear_fc1(x)))`` (Qwen3-VL, Qwen3.5).

The activation becomes ``kiln.gelu``; for the tanh form on CUDA, without autograd, it goes into
the first projection's cuBLASLt epilogue instead, so the projection's output never makes a round
trip through memory (as for diffusers' ``GELU``). Both projections stay the module's own. QuickGELU
(CLIP's, Qwen2-VL's) and other activations are left with the reason.
"""

from typing import Callable, Optional, Union

import torch

from .. import activation_ops
from . import forwards
from .detect import (_MLP_HIDDEN, _MLP_INNER, Match, NoMatch, _identify_activation, compare_with_probe_projections,
                     has_child, other_children)

# The projections' names, as each family spells them.
PROJECTIONS = (("fc1", "fc2"), ("linear_fc1", "linear_fc2"))
ACTIVATION_ATTRS = ("activation_fn", "act_fn", "act")
_APPROXIMATE = {"gelu_tanh": "tanh", "gelu": "none"}


def _projections(module: torch.nn.Module) -> Optional[tuple]:
    return next((names for names in PROJECTIONS if all(has_child(module, n) for n in names)), None)


def _activation_attr(module: torch.nn.Module) -> Optional[str]:
    return next((name for name in ACTIVATION_ATTRS if callable(getattr(module, name, None))), None)


def candidate(module: torch.nn.Module) -> bool:
    """A module with two projections (``fc1``/``fc2`` or ``linear_fc1``/``linear_fc2``) and an
    activation (``activation_fn``, ``act_fn`` or ``act``)."""
    return _projections(module) is not None and _activation_attr(module) is not None


def gelu_between(first: str, second: str, attr: str, approximate: str) -> Callable:
    """``second(gelu(first(x)))`` with the GELU as kiln's (see the module's docstring); the
    module's own ``attr`` activation where it is no longer the one probed."""

    def factory(module: torch.nn.Module, original: Callable) -> Callable:
        def forward(*args, **kwargs):
            if not forwards._single_tensor_call(args, kwargs):
                return original(*args, **kwargs)
            x = args[0]
            act = getattr(module, attr)
            if not forwards.runs_probed_activation(module, act):
                return getattr(module, second)(act(getattr(module, first)(x)))
            hidden = forwards._gemm_gelu_epilogue(getattr(module, first), x) if approximate == "tanh" else None
            if hidden is None:
                hidden = getattr(module, first)(x)
                hidden = activation_ops.gelu(hidden, None, approximate) \
                    if forwards.kiln_can_take(hidden, differentiable=True) else act(hidden)
            return getattr(module, second)(hidden)

        return forward

    return factory


def classify(module: torch.nn.Module, original: Callable) -> Union[Match, NoMatch]:
    first, second = _projections(module)
    attr = _activation_attr(module)
    others = other_children(module, (first, second, attr))
    if others:
        return NoMatch("mlp", others)
    # A dropout kept as a float (Llama 4's projector) is applied by the forward, not by a child.
    if "dropout" in getattr(getattr(type(module).forward, "__code__", None), "co_names", ()):
        return NoMatch("mlp", "its forward applies a dropout, which kiln's would not")
    act_fn = getattr(module, attr)
    act = _identify_activation(act_fn)
    if act not in _APPROXIMATE:
        return NoMatch("mlp", f"its {attr} ({type(act_fn).__name__}) is not GELU on a probe")
    approximate = _APPROXIMATE[act]
    factory = gelu_between(first, second, attr, approximate)
    why = compare_with_probe_projections(module, original, factory, attr,
                                         ((first, _MLP_HIDDEN, _MLP_INNER), (second, _MLP_INNER, _MLP_HIDDEN)))
    if why is not None:
        return NoMatch("mlp", f"does not compute {second}({attr}({first}(x))): {why}")
    kind = "mlp gelu (tanh)" if approximate == "tanh" else "mlp gelu"
    return Match(kind, "gelu", factory)
