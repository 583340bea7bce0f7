"""The gated activation of transformers' MoE experts (``@use_experts_implementation``:
Mixtral, Qwen3-MoE, Qwen3-Next, DeepSeek-V3, GLM-4.5 and GLM-4.7, OLMoE and more).

transformers 5 runs a model's experts through the implementation ``config._experts_implementation``
names: "grouped_mm" (its default where torch has grouped GEMMs) or "batched_mm" project every
routed (token, expert) pair at once into one [S, 2I] tensor and call the module's
``_apply_gate`` on it: ``act_fn(gate) * up`` over its two halves, two kernels and a strided
read of each half. kiln sets ``_apply_gate`` on the module itself to one ``kiln.swiglu`` (or
``kiln.geglu``) over the packed tensor, once probes show the class's own computes that with
the gate first; the projections, the routing and the class stay transformers'. The "eager"
implementation loops over the experts with its own ``act_fn(gate) * up`` and never calls
``_apply_gate``: its modules are left, with that reason. A class whose ``_apply_gate`` computes something else
is left, with the reason.

GPT-OSS's experts have no ``act_fn``: their ``_apply_gate`` clamps the gate at ``limit`` and up to
``+-limit`` and computes ``(up + 1) * gate * sigmoid(alpha * gate)`` over the packed tensor's
interleaved pairs, seven kernels in eager mode. Where probes show that (interleaved pairs, or the
halves), with the module's own ``alpha`` and ``limit``, kiln sets ``_apply_gate`` to one
``kiln.clamped_swiglu``, which reads both scalars from the module at each call as the class does.

Under torch.compile the gate is the class's own: Inductor generates the same one-pass kernel and
fuses into it what the experts' forward does around the call (transformers 5.17 zeroes the
sentinel rows of the packed tensor just before it), where an opaque op would keep that apart. On
a compiled Qwen3-30B-A3B-shaped prefill kiln's op there cost 0.23 ms of 8.3 (a masked-fill
kernel of its own), which left the patched model slower than the unpatched one
(bench/diagnostics/decoder_profile.py).
"""

from typing import Callable, Union

import torch

from .. import activation_ops
from . import detect
from .forwards import (PACKED_OPS, forget_activation, gate_packed, kiln_can_take, remember_activation,
                       runs_probed_activation)

METHOD = "_apply_gate"


def candidate(module: torch.nn.Module) -> bool:
    """An experts module of transformers' experts implementations: its class has an
    ``_apply_gate`` and the module a gate (``has_gate``)."""
    return callable(getattr(type(module), METHOD, None)) and getattr(module, "has_gate", False) is True


def experts_gate(activation: str) -> Callable:
    """The factory of the module's ``_apply_gate``: ``activation`` is a key of
    ``forwards.ACTIVATIONS``, applied to the first half of the packed tensor."""
    def factory(module: torch.nn.Module, original: Callable) -> Callable:
        # Set on the instance, so called with the packed tensor alone.
        def _apply_gate(gate_up_out: torch.Tensor) -> torch.Tensor:
            if not torch.compiler.is_compiling() and isinstance(gate_up_out, torch.Tensor) \
                    and gate_up_out.dim() >= 1 and gate_up_out.shape[-1] % 2 == 0 \
                    and runs_probed_activation(module, module.act_fn) \
                    and kiln_can_take(gate_up_out, differentiable=True):
                return gate_packed(activation, gate_up_out, False)
            return original(gate_up_out)

        return _apply_gate

    return factory


def _clamp_scalars(module: torch.nn.Module) -> bool:
    """Whether the module's ``alpha`` and ``limit`` are numbers kiln.clamped_swiglu takes."""
    alpha, limit = getattr(module, "alpha", None), getattr(module, "limit", None)
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (alpha, limit))
    return numbers and abs(alpha) < float("inf") and 0 < limit < float("inf")


def clamped_gate(interleaved: bool) -> Callable:
    """The factory of a GPT-OSS-style module's ``_apply_gate``: one ``kiln.clamped_swiglu`` with the
    module's ``alpha`` and ``limit`` as they are at the call."""
    def factory(module: torch.nn.Module, original: Callable) -> Callable:
        def _apply_gate(gate_up_out: torch.Tensor) -> torch.Tensor:
            if not torch.compiler.is_compiling() and isinstance(gate_up_out, torch.Tensor) \
                    and gate_up_out.dim() >= 1 and gate_up_out.shape[-1] % 2 == 0 \
                    and _clamp_scalars(module) and kiln_can_take(gate_up_out, differentiable=True):
                return activation_ops.clamped_swiglu(gate_up_out, float(module.alpha), float(module.limit),
                                                     interleaved)
            return original(gate_up_out)

        return _apply_gate

    return factory


def _classify_clamped(module: torch.nn.Module, own: Callable) -> Union[detect.Match, detect.NoMatch]:
    """An experts module without act_fn: a Match when its ``_apply_gate`` is GPT-OSS's clamped gate
    over interleaved pairs (or halves) with its own ``alpha`` and ``limit``."""
    if not _clamp_scalars(module):
        return detect.NoMatch("moe experts", f"it has no act_fn, nor a numeric alpha and limit > 0: its {METHOD} "
                                             "computes a gate of its own, which no kiln op computes")
    generator = torch.Generator().manual_seed(0)
    # Values of a few limits either side, so both clamps and the region between them are probed.
    scale = float(module.limit)
    inputs = [(torch.randn(7, 2 * 40, generator=generator) * scale + 0.5).to(d) for d in detect._PROBE_DTYPES]
    reasons = []
    for interleaved in (True, False):
        factory = clamped_gate(interleaved)
        with torch.no_grad():
            why = detect._compare(own, factory(module, own), inputs)
        if why is None:
            form = "interleaved pairs" if interleaved else "halves"
            return detect.Match(f"moe experts clamped_swiglu (their {METHOD} over the packed gate_up's {form})",
                                "clamped_swiglu", factory, method=METHOD)
        reasons.append(why)
    return detect.NoMatch("moe experts", f"it has no act_fn, and its {METHOD} does not compute GPT-OSS's clamped "
                                         f"gate (up + 1) * gate * sigmoid(alpha * gate) of interleaved pairs "
                                         f"({reasons[0]}) or of halves ({reasons[1]})")


def _kind(activation: str) -> str:
    op, approximate = PACKED_OPS[activation]
    return f"moe experts {op}{' (tanh)' if approximate == 'tanh' else ''} (their {METHOD} over the packed gate_up)"


def classify(module: torch.nn.Module, original: Callable) -> Union[detect.Match, detect.NoMatch]:
    """A Match (installed as the module's ``_apply_gate``) when the class's ``_apply_gate``
    computes ``act(gate) * up`` of the packed tensor's halves, gate first, on random probes
    (fp32, bf16, fp16, and values past a clamp), or, with no ``act_fn``, GPT-OSS's clamped gate;
    else a NoMatch with the reason."""
    implementation = getattr(getattr(module, "config", None), "_experts_implementation", None)
    if implementation == "eager":
        return detect.NoMatch("moe experts", f"its experts run transformers' eager loop (experts_implementation "
                                             f"\"eager\"), which computes act(gate) * up itself; \"grouped_mm\" "
                                             f"and \"batched_mm\" call {METHOD}")
    own = getattr(type(module), METHOD).__get__(module)
    if not callable(getattr(module, "act_fn", None)):
        return _classify_clamped(module, own)
    activation = detect._identify_activation(module.act_fn)
    if activation is None:
        return detect.NoMatch("moe experts", f"its act_fn ({type(module.act_fn).__name__}) is not SiLU or GELU "
                                             "on a probe")
    generator = torch.Generator().manual_seed(0)
    inputs = detect.with_large_values(
        [(torch.randn(7, 2 * 40, generator=generator) + 0.5).to(d) for d in detect._PROBE_DTYPES])
    factory = experts_gate(activation)
    remember_activation(module, "act_fn")  # the replacement runs kiln's op only for it
    with torch.no_grad():
        why = detect._compare(own, factory(module, own), inputs)
    if why is not None:
        forget_activation(module)
        return detect.NoMatch("moe experts", f"its {METHOD} does not compute act(gate) * up of its input's halves, "
                                             f"gate first: {why}")
    return detect.Match(_kind(activation), PACKED_OPS[activation][0], factory, method=METHOD)
