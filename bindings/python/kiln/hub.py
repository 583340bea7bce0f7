"""kiln's layers for Hugging Face's hub-kernel mechanism (the optional ``kernels`` package).

transformers marks layers with ``@use_kernel_forward_from_hub("RMSNorm")`` and the like;
``kernels.kernelize`` swaps such a layer's forward for the one of the layer class a kernel
mapping names. :func:`kernel_mapping` names kiln's classes, so no Hub download happens::

    from kernels import Mode, kernelize, use_kernel_mapping
    with use_kernel_mapping(kiln.hub.kernel_mapping()):
        kernelize(model, mode=Mode.INFERENCE, device="cuda")   # or INFERENCE | TORCH_COMPILE

The classes follow ``kernels``' layer rules: stateless (no ``__init__``, no members beyond
``can_torch_compile`` and ``has_backward``), a ``forward`` with the replaced forward's
parameters, reading the replaced module's own attributes (``weight``, ``variance_epsilon``).
Each calls kiln where kiln computes the same thing and the layer's class forward otherwise
(other dtypes or layouts). kiln's ops have backward formulas (C++ autograd kernels, in
bindings/torch/autograd_*.cpp), so those layers declare ``has_backward = True`` and serve
``Mode.TRAINING`` as well as ``Mode.INFERENCE``; ``RMSNormGated``'s op has none, so it declares
``has_backward = False`` and is mapped for inference only. They are plain classes, importable
and testable without ``kernels``.
"""

import sys
from typing import Dict, Iterable, Type

import torch

from . import activation_ops, norm_ops, ops, rope_ops
from .patching.forwards import kiln_can_take, norm_eps
from .patching.gated_norm import ACTIVATIONS
from .patching.rope_attention import rope_layout


class RMSNorm(torch.nn.Module):
    """transformers' ``RMSNorm`` layers (Llama, Mistral, Qwen2, ...): ``weight *
    normalized.to(input_dtype)``. One kiln call when weight and input share a dtype (kiln
    rounds once, after the weight multiply: at most an ulp from the original); otherwise kiln
    normalises and the weight multiplies in the promoted dtype, as the original does."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states):
        weight = self.weight
        if (weight.device != hidden_states.device
                or not kiln_can_take(hidden_states, differentiable=True)):
            return type(self).forward(self, hidden_states)
        eps = norm_eps(self, hidden_states)
        if weight.dtype == hidden_states.dtype:
            return ops.rms_norm(hidden_states, weight, eps)
        return weight * ops.rms_norm(hidden_states, None, eps)


class RMSNormGated(torch.nn.Module):
    """transformers' ``RMSNormGated`` layers: ``rms_norm(x) * weight * act(gate)``, normalised
    before it is gated, ``act`` the layer's ``activation`` (Qwen3-Next, Qwen3.5, OLMo's hybrid:
    ``"silu"``; Kimi Linear, GLM-5 Next, Bailing's hybrid: ``"sigmoid"``). One
    ``kiln.rms_norm_gated`` call where x, the gate and the weight share a dtype and device and no
    gradient is wanted (kiln rounds once where the original rounds up to three times: within two
    ulps); the class forward otherwise."""

    can_torch_compile = True
    has_backward = False

    def forward(self, hidden_states, gate=None):
        activation = getattr(self, "activation", None)
        weight = self.weight
        if (gate is None or activation not in ACTIVATIONS or gate.shape != hidden_states.shape
                or not kiln_can_take(hidden_states, gate, weight)):
            return type(self).forward(self, hidden_states, gate)
        return norm_ops.rms_norm_gated(hidden_states, gate, weight, norm_eps(self, hidden_states), activation)


class RotaryPosEmb(torch.nn.Module):
    """transformers' ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` (layer name
    ``rotary_pos_emb``): rotate_half RoPE of q and k in one kiln launch. ``unsqueeze_dim`` 1
    is q of ``[B, H, S, D]``, 2 is ``[B, S, H, D]``; cos/sin ``[B, S, D]`` or ``[S, D]``, of q's
    dtype (an fp32 table promotes the original's output to fp32: that call stays the
    original's)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        layout = rope_layout(q, k, cos, sin, unsqueeze_dim)
        if layout is None:
            return type(self).forward(self, q, k, cos, sin, unsqueeze_dim)
        return rope_ops.rope(q, k, cos, sin, layout=layout)


def _gelu_layer(name: str, approximate: str) -> Type[torch.nn.Module]:
    def forward(self, input):
        if not kiln_can_take(input, differentiable=True):
            return type(self).forward(self, input)
        return activation_ops.gelu(input, None, approximate)

    doc = f"transformers' ``{name}`` activation: ``F.gelu(x, approximate=\"{approximate}\")``."
    return type(name, (torch.nn.Module,), {"__doc__": doc, "forward": forward,
                                            "can_torch_compile": True, "has_backward": True,
                                            "__module__": __name__})


GeLU = _gelu_layer("GeLU", "none")
GeluTanh = _gelu_layer("GeluTanh", "tanh")
NewGELU = _gelu_layer("NewGELU", "tanh")


def _and_mul_layer(name: str, glu: str, approximate: str) -> Type[torch.nn.Module]:
    def forward(self, x):
        if not kiln_can_take(x, differentiable=True) or x.shape[-1] % 2:
            return type(self).forward(self, x)
        if glu == "swiglu":
            return activation_ops.swiglu(x)
        return activation_ops.geglu(x, None, approximate)

    doc = (f"The ``{name}`` layer of kernels' activation repositories: the packed ``[..., 2I]`` "
           f"gate/up projection to ``[..., I]`` with kiln.{glu}.")
    return type(name, (torch.nn.Module,), {"__doc__": doc, "forward": forward,
                                            "can_torch_compile": True, "has_backward": True,
                                            "__module__": __name__})


SiluAndMul = _and_mul_layer("SiluAndMul", "swiglu", "none")
GeluAndMul = _and_mul_layer("GeluAndMul", "geglu", "none")
GeluTanhAndMul = _and_mul_layer("GeluTanhAndMul", "geglu", "tanh")

# Hub layer name -> kiln's class. The names are the ones transformers' layers declare
# (``@use_kernel_forward_from_hub(...)``) and kernels' activation repositories export.
LAYERS: Dict[str, Type[torch.nn.Module]] = {
    "RMSNorm": RMSNorm,
    "RMSNormGated": RMSNormGated,
    "rotary_pos_emb": RotaryPosEmb,
    "GeLU": GeLU,
    "GeluTanh": GeluTanh,
    "NewGELU": NewGELU,
    "SiluAndMul": SiluAndMul,
    "GeluAndMul": GeluAndMul,
    "GeluTanhAndMul": GeluTanhAndMul,
}

# kiln's kernels target sm_75 and newer (T4, A100, H100/H200).
_MIN_CUDA_CAPABILITY = 75


class KilnLayerRepository:
    """A kernels layer repository served from the installed kiln package (no download)."""

    def __init__(self, layer_name: str):
        if layer_name not in LAYERS:
            raise ValueError(f"kiln.hub: layer_name: expected one of {sorted(LAYERS)}, "
                             f"got {layer_name!r}")
        self.layer_name = layer_name

    def load(self) -> Type[torch.nn.Module]:
        return LAYERS[self.layer_name]

    def __eq__(self, other):
        return isinstance(other, KilnLayerRepository) and other.layer_name == self.layer_name

    def __hash__(self):
        return hash(("kiln", self.layer_name))

    def __str__(self):
        return f"kiln (layer `{self.layer_name}`)"


def kernel_mapping(layers: Iterable[str] = tuple(LAYERS), devices: Iterable[str] = ("cuda",),
                   torch_compile: bool = True, training: bool = True) -> dict:
    """A mapping for ``kernels.use_kernel_mapping`` / ``register_kernel_mapping``: each of
    ``layers`` (hub layer names, default all of :data:`LAYERS`) on each of ``devices``
    ("cuda": GPUs of compute capability 7.5 and newer; "cpu": kiln's fp32 reference, for
    tests) for ``Mode.INFERENCE``, with ``training`` for ``Mode.TRAINING`` too (the layers that
    have a backward), and with ``torch_compile`` for each of those ``| Mode.TORCH_COMPILE``.
    Needs the ``kernels`` package."""
    try:
        from kernels import CUDAProperties, Device, Mode
    except ImportError as error:
        raise ImportError("kiln.hub.kernel_mapping: needs the `kernels` package "
                          "(pip install kernels)") from error
    mapping = {}
    for name in layers:
        repo = KilnLayerRepository(name)
        modes = {}
        trains = training and LAYERS[name].has_backward
        for base in (Mode.INFERENCE, Mode.TRAINING) if trains else (Mode.INFERENCE,):
            modes[base] = repo
            if torch_compile:
                modes[base | Mode.TORCH_COMPILE] = repo
        per_device = {}
        for device in devices:
            if device == "cuda":
                key = Device(type="cuda", properties=CUDAProperties(
                    min_capability=_MIN_CUDA_CAPABILITY, max_capability=sys.maxsize))
            elif device == "cpu":
                key = Device(type="cpu")
            else:
                raise ValueError(f"kiln.hub.kernel_mapping: devices: expected 'cuda' or 'cpu', "
                                 f"got {device!r}")
            per_device[key] = dict(modes)
        mapping[name] = per_device
    return mapping
