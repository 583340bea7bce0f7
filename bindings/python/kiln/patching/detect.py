"""Which modules compute what kiln has an op for, decided by what they compute.

A module is a candidate by its attributes (a norm: a leaf with ``variance_epsilon`` or
``eps`` and a 1-D ``weight`` or none; a gated MLP: ``gate_proj``, ``up_proj``,
``down_proj`` and ``act_fn``, or Lumina's ``linear_1``, ``linear_3``, ``linear_2`` and ``silu``;
diffusers' GELU: a ``proj`` child, ``approximate`` and a
``gelu`` method), never by its class. A candidate is replaced only when the
replacement computes what its own forward computes on a random probe: the original
forward and the replacement run on the same CPU probe (a random weight of the module's
size and dtype for a norm, small random projections of the module's dtype for an MLP),
for inputs of the weight's dtype and of the other float dtypes, and must agree in dtype,
shape and value. Variants with different dtype rules (Gemma's ``1 + weight``, Llama's
rounding before the weight multiply, ``nn.RMSNorm``'s single rounding) are told apart
the same way.
"""

import contextlib
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple, Union

import warnings

import torch

from . import forwards

_PROBE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Match:
    kind: str
    op: str  # the kiln op, or "" where the op filter decides
    factory: Callable  # (module, original forward) -> replacement forward
    family: str = ""  # the name kiln.patch's ops filter knows it by, where not op's own
    # The module's method the factory replaces (then given the bound original method):
    # its forward, or another its forward calls (an MoE experts module's _apply_gate).
    method: str = "forward"


@dataclass(frozen=True)
class NoMatch:
    kind: str
    reason: str


def _tolerance(dtype: torch.dtype) -> float:
    # Two ulps of the output dtype: the originals round twice where kiln rounds once (Llama's
    # norm before its weight multiply, SiLU before the up multiply), and fp32 sums in
    # another order; a different computation is off by far more on a random probe.
    return max(2.0 * torch.finfo(dtype).eps, 1e-5)


def _agree(expected: torch.Tensor, actual: torch.Tensor, scale: float = 0.0) -> Optional[str]:
    if not isinstance(actual, torch.Tensor):
        return f"returned {type(actual).__name__}, not a tensor"
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return f"gives {actual.dtype} {tuple(actual.shape)} where the original gives {expected.dtype} {tuple(expected.shape)}"
    tol = _tolerance(expected.dtype)
    e, a = expected.double(), actual.double()
    bound = tol * (e.abs() + scale) + tol
    worst = ((a - e).abs() - bound).max().item()
    if not worst <= 0.0:
        return f"differs from the original by up to {(a - e).abs().max().item():.3g} in {expected.dtype}"
    return None


def _probe_inputs(hidden: int, dtypes, generator: torch.Generator) -> List[torch.Tensor]:
    # A nonzero mean, so that a LayerNorm (which subtracts it) is not mistaken for an RMSNorm.
    base = torch.randn(3, 5, hidden, generator=generator) + 0.5
    return [base.to(d) for d in dtypes]


def with_large_values(inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    """The probe inputs and the first of them 30 times over: projected, its values reach well
    past a clamp a gated forward may apply (GPT-OSS's at 7), which unit-sized values never do."""
    return inputs + [inputs[0] * 30.0]


def _compare(original: Callable, candidate: Callable, inputs: List[torch.Tensor],
             scale_of=lambda out: 0.0) -> Optional[str]:
    """None when the candidate agrees with the original on every probe input the original
    accepts (and it accepts at least one); else why not."""
    compared, first_error = 0, None
    with warnings.catch_warnings():
        # torch warns on mixed-dtype probes it computes anyway; the probe is not the user's call.
        warnings.simplefilter("ignore")
        for x in inputs:
            why = _compare_one(original, candidate, x, scale_of)
            if why is None:
                compared += 1
            elif why.startswith("original: "):
                first_error = first_error or why[len("original: "):]
            else:
                return why
    if compared == 0:
        return f"its forward fails on every probe ({first_error})"
    return None


def _compare_one(original: Callable, candidate: Callable, x: torch.Tensor, scale_of) -> Optional[str]:
    try:
        expected = original(x)
    except Exception as e:  # an input dtype this module does not take
        return f"original: {type(e).__name__}: {e}"
    try:
        actual = candidate(x)
    except Exception as e:
        return f"the replacement fails on a {x.dtype} probe ({type(e).__name__}: {e})"
    why = _agree(expected, actual, scale_of(expected))
    if why is not None:
        return f"on a {x.dtype} probe the replacement {why}"
    return None


class _Swapped:
    """Temporarily replaces a module's parameters or children (restored on exit). A "parameter"
    the module keeps as a buffer or a plain attribute is swapped where it is kept."""

    def __init__(self, module: torch.nn.Module, params: Dict[str, torch.Tensor] = None,
                 children: Dict[str, torch.nn.Module] = None):
        self.module, self.params, self.children = module, params or {}, children or {}

    def _home(self, name: str) -> dict:
        for home in (self.module._parameters, self.module._buffers):
            if name in home:
                return home
        return self.module.__dict__

    def __enter__(self):
        self.saved_params = [(home, k, home.get(k, _ABSENT)) for k in self.params for home in (self._home(k),)]
        self.saved_children = {k: self.module._modules[k] for k in self.children}
        for home, k, _ in self.saved_params:
            v = self.params[k]
            home[k] = torch.nn.Parameter(v, requires_grad=False) if home is self.module._parameters else v
        self.module._modules.update(self.children)
        return self

    def __exit__(self, *exc):
        for home, k, v in self.saved_params:
            if v is _ABSENT:
                home.pop(k, None)
            else:
                home[k] = v
        self.module._modules.update(self.saved_children)
        return False


_ABSENT = object()


# Tried in this order: the first whose replacement agrees on every probe is taken. The
# Llama rule comes before the plain one because a mixed-dtype probe tells them apart only
# that way round (the plain replacement defers to the original on mixed dtypes); the
# diffusers rule likewise, and its output dtype (the weight's for a half weight, fp32 for
# an fp32 one) sets it apart from Llama's and torch's on the mixed probes.
NORM_VARIANTS: Tuple[Tuple[str, Callable], ...] = (
    ("rms_norm (1 + weight, fp32 math: Gemma)", forwards.rms_norm_offset),
    ("rms_norm (rounded before the weight: Llama)", forwards.rms_norm_llama),
    ("rms_norm (weight's dtype rule: diffusers)", forwards.rms_norm_diffusers),
    ("rms_norm", forwards.rms_norm_plain),
)
LAYER_NORM_VARIANT = ("layer_norm", forwards.layer_norm)
# A norm whose scale has another name than ``weight`` (and no weight or bias): Stable Audio 3's.
SCALE_NAMED_GAMMA = ("rms_norm (scale named gamma)", forwards.rms_norm_gamma)


def norm_candidate(module: torch.nn.Module) -> bool:
    if any(True for _ in module.children()):
        return False
    if not (hasattr(module, "variance_epsilon") or hasattr(module, "eps")):
        return False
    weight = getattr(module, "weight", None)
    return weight is None or (isinstance(weight, torch.Tensor) and weight.dim() == 1)


def _normalized_shape(module: torch.nn.Module) -> Optional[Tuple[int, ...]]:
    """torch names it ``normalized_shape``, diffusers' RMSNorm ``dim``."""
    for name in ("normalized_shape", "dim"):
        shape = getattr(module, name, None)
        if isinstance(shape, (tuple, list, torch.Size)) and all(isinstance(n, int) for n in shape):
            return tuple(shape)
    return None


# What was found in the current kiln.patch call, by what it depends on: every layer of a model
# holds norms of one class and state, probed once instead of once a layer (and a norm another
# patch reads, a layer's or an attention's, is not probed again when the walk reaches it).
_FOUND: Optional[dict] = None

# What every module holds for torch itself (hooks, children, flags): a probe calls the forward
# directly, so none of it but ``training`` enters what the forward computes.
_MODULE_INTERNALS = frozenset(torch.nn.Module().__dict__) - {"training", "_parameters", "_buffers"}
_OWN_FORWARDS = frozenset(("forward", "_old_forward"))


@contextlib.contextmanager
def probing_once():
    """Within the block, :func:`remembered` keeps what it computes (nothing a probe depends on
    changes while kiln.patch walks the model)."""
    global _FOUND
    outer, _FOUND = _FOUND, {}
    try:
        yield
    finally:
        _FOUND = outer


def state_key(module: torch.nn.Module) -> Optional[tuple]:
    """What a leaf module's forward can read of itself but the values of the weight and bias
    a probe swaps for its own: its class, its parameters' dtypes, shapes and devices, and its
    other attributes where they are plain values; None where it holds anything else (a buffer,
    another parameter, an object, a hook of accelerate's)."""
    items = []
    for name, value in module.__dict__.items():
        if name in _MODULE_INTERNALS or name in _OWN_FORWARDS or name.startswith("_kiln"):
            continue
        if name == "_buffers":
            if value:
                return None
        elif name == "_parameters":
            if set(value) - {"weight", "bias", "gamma"}:
                return None
            items.append((name, tuple(sorted((n, None if t is None else (t.dtype, tuple(t.shape), t.device.type))
                                             for n, t in value.items()))))
        elif value is None or isinstance(value, (bool, int, float, str)):
            items.append((name, value))
        elif isinstance(value, (tuple, list)) and all(isinstance(v, (bool, int, float, str)) for v in value):
            items.append((name, tuple(value)))
        else:
            return None
    return type(module), tuple(items)


def remembered(key: Optional[tuple], compute: Callable):
    """``compute()``, or what it gave for ``key`` earlier in this kiln.patch call (a None key
    is computed every time)."""
    if _FOUND is None or key is None:
        return compute()
    if key not in _FOUND:
        _FOUND[key] = compute()
    return _FOUND[key]


def forward_key(module: torch.nn.Module, forward: Callable) -> Optional[tuple]:
    """What a probe of ``forward`` (the module's own, bound to it) depends on, as a key; None
    where it is another function or the module holds what :func:`state_key` cannot tell."""
    state = state_key(module)
    if getattr(forward, "__self__", None) is not module or state is None:
        return None
    return forward.__func__, state


def classify_norm(module: torch.nn.Module, original: Callable) -> Union[Match, NoMatch]:
    """What the norm computes, as a Match of kiln's variants or a NoMatch saying why none."""
    key = forward_key(module, original)
    return remembered(key and ("norm", key), lambda: _classify_norm(module, original))


def _other_tensors(module: torch.nn.Module) -> list:
    """The names of the tensors a module holds (parameters, buffers, plain attributes) besides
    its weight and bias."""
    held = {**module.__dict__, **module._parameters, **module._buffers}
    return sorted(name for name, value in held.items()
                  if isinstance(value, torch.Tensor) and name not in ("weight", "bias"))


def _classify_norm(module: torch.nn.Module, original: Callable) -> Union[Match, NoMatch]:
    weight = getattr(module, "weight", None)
    bias = getattr(module, "bias", None)
    others = _other_tensors(module)
    if others == ["gamma"] and weight is None and bias is None:
        return _classify_gamma_norm(module, original)
    if others:
        # Its forward may read them (a scale under another name), where kiln's norms read only a
        # weight and a bias (or a gamma, above); a probe would agree wherever they hold ones and
        # zeros, as an untrained model's do, and the trained values would then be ignored.
        return NoMatch("norm", f"it holds tensors besides a weight and a bias ({', '.join(others)}), "
                               "which kiln's norms do not read")
    if bias is not None and not (isinstance(bias, torch.Tensor) and bias.dim() == 1):
        return NoMatch("norm", f"its bias is a {type(bias).__name__} of another shape than [hidden]")
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if eps is not None and not isinstance(eps, (int, float)):
        return NoMatch("norm", f"its eps is a {type(eps).__name__}, not a number")
    if isinstance(getattr(module, "num_groups", None), int):
        return NoMatch("norm", "it normalises groups of channels (a GroupNorm); kiln's norms take the last dimension")
    shape = _normalized_shape(module)
    if shape is not None and len(shape) != 1:
        return NoMatch("norm", f"it normalises over the last {len(shape)} dimensions; kiln's norms take the last one")
    generator = torch.Generator().manual_seed(0)
    swap = {}
    if weight is None and bias is None:
        # Without a weight the width is the input's: a norm may not know it (Mochi's RMSNorm(0)).
        hidden = shape[-1] if shape and shape[-1] > 0 else 64
        variants = NORM_VARIANTS[-1:]
        dtypes = _PROBE_DTYPES
    else:
        like = weight if weight is not None else bias
        hidden = like.shape[0]
        # An RMSNorm has no bias: with one, only the LayerNorm is tried.
        variants = NORM_VARIANTS if bias is None else ()
        if weight is not None:
            swap["weight"] = torch.randn(hidden, generator=generator).to(weight.dtype)
        if bias is not None:
            swap["bias"] = torch.randn(hidden, generator=generator).to(bias.dtype)
        dtypes = (like.dtype,) + tuple(d for d in _PROBE_DTYPES if d != like.dtype)
    variants = tuple(variants) + (LAYER_NORM_VARIANT,)
    inputs = _probe_inputs(hidden, dtypes, generator)
    reasons = []
    with torch.no_grad(), _Swapped(module, params=swap):
        for kind, factory in variants:
            why = _compare(original, factory(module, original), inputs)
            if why is None:
                return Match(kind, "layer_norm" if factory is forwards.layer_norm else "rms_norm", factory)
            if why.startswith("its forward fails"):
                return NoMatch("norm", why)
            reasons.append(why)
    # The reasons the most general variants gave (the plain RMSNorm's and the LayerNorm's).
    if len(reasons) == 1:
        return NoMatch("norm", "does not compute a LayerNorm (it has a bias, so not an RMSNorm): " + reasons[0])
    return NoMatch("norm", f"does not compute an RMSNorm: {reasons[-2]}; nor a LayerNorm: {reasons[-1]}")


def _classify_gamma_norm(module: torch.nn.Module, original: Callable) -> Union[Match, NoMatch]:
    """A norm whose one tensor is ``gamma``: an RMSNorm scaled by it, or NoMatch."""
    gamma = module.gamma
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if gamma.dim() != 1 or not isinstance(eps, (int, float)):
        return NoMatch("norm", f"its gamma is not one [hidden] row ({tuple(gamma.shape)}) or its eps not a number")
    generator = torch.Generator().manual_seed(0)
    swap = {"gamma": 1 + 0.3 * torch.randn(gamma.shape[0], generator=generator).to(gamma.dtype)}
    dtypes = (gamma.dtype,) + tuple(d for d in _PROBE_DTYPES if d != gamma.dtype)
    inputs = _probe_inputs(gamma.shape[0], dtypes, generator)
    kind, factory = SCALE_NAMED_GAMMA
    with torch.no_grad(), _Swapped(module, params=swap):
        why = _compare(original, factory(module, original), inputs)
    if why is None:
        return Match(kind, "rms_norm", factory)
    return NoMatch("norm", f"does not compute an RMSNorm scaled by its gamma: {why}")


_COMPUTE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def probe_dtype(projection: torch.nn.Module) -> torch.dtype:
    """The dtype a probe gives a projection's stand-in: its weight's, where the weight computes
    in it (not an fp8 weight that diffusers' layerwise casting upcasts for each call)."""
    weight = getattr(projection, "weight", None)
    return weight.dtype if isinstance(weight, torch.Tensor) and weight.dtype in _COMPUTE_DTYPES else torch.float32


def probe_linear(n_in: int, n_out: int, like: torch.nn.Module, dtype: torch.dtype,
                 generator: torch.Generator) -> torch.nn.Linear:
    """A small random ``nn.Linear`` standing in for the projection ``like`` on a probe, with a
    bias where it has one."""
    layer = torch.nn.Linear(n_in, n_out, bias=getattr(like, "bias", None) is not None)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n_out, n_in, generator=generator) / n_in ** 0.5)
        if layer.bias is not None:
            layer.bias.copy_(torch.randn(n_out, generator=generator))
    return layer.to(dtype).requires_grad_(False)


def gelu_candidate(module: torch.nn.Module) -> bool:
    """diffusers' ``GELU``: a ``proj`` child, an ``approximate`` of F.gelu's and a
    ``gelu`` method."""
    return isinstance(getattr(module, "proj", None), torch.nn.Module) \
        and getattr(module, "approximate", None) in ("tanh", "none") and callable(getattr(module, "gelu", None))


def classify_gelu(module: torch.nn.Module, original: Callable) -> Union[Match, NoMatch]:
    proj = module.proj
    dtype = probe_dtype(proj)
    generator = torch.Generator().manual_seed(0)
    n_in, n_out = 24, 40
    probe_proj = probe_linear(n_in, n_out, proj, dtype, generator)
    dtypes = (dtype,) + tuple(d for d in _PROBE_DTYPES if d != dtype)
    inputs = _probe_inputs(n_in, dtypes, generator)
    factory = forwards.gelu_after_proj
    with torch.no_grad(), _Swapped(module, children={"proj": probe_proj}):
        why = _compare(original, factory(module, original), inputs)
    if why is not None:
        return NoMatch("gelu", f"does not compute F.gelu(proj(x), approximate={module.approximate!r}): {why}")
    return Match("gelu (tanh)" if module.approximate == "tanh" else "gelu", "gelu", factory)


def has_child(module: torch.nn.Module, name: str) -> bool:
    return isinstance(getattr(module, name, None), torch.nn.Module)


# A gated MLP's (gate, up, down) projections and the attributes it may keep its activation in:
# transformers' (``act_fn``; Llama 4's ``activation_fn``), Lumina's feed-forward (Lumina-Next,
# Lumina-Image 2.0: ``linear_2(silu(linear_1(x)) * linear_3(x))``, its SiLU in fp32) and Qwen-Image
# 2.1's (``out(silu(gate_layer(x)) * proj(x))``); with no activation attribute, a forward that
# calls it itself (Krea 2's ``down(F.silu(gate(x)) * up(x))``), which the probe identifies.
MLP_LAYOUTS = ((("gate_proj", "up_proj", "down_proj"), ("act_fn", "activation_fn")),
               (("linear_1", "linear_3", "linear_2"), ("silu",)),
               (("gate_layer", "proj", "out"), ("activation_fn",)),
               (("gate", "up", "down"), ()))


def mlp_layout(module: torch.nn.Module) -> Optional[Tuple[Tuple[str, str, str], Optional[str]]]:
    """A gated MLP's projection names and activation attribute (None for a layout whose forward
    calls its activation itself), or None where it has none of MLP_LAYOUTS'."""
    for names, activations in MLP_LAYOUTS:
        if all(has_child(module, n) for n in names):
            if not activations:
                return names, None
            attr = next((name for name in activations if callable(getattr(module, name, None))), None)
            if attr is not None:
                return names, attr
    return None


def mlp_candidate(module: torch.nn.Module) -> bool:
    return mlp_layout(module) is not None


def _identify_activation(act_fn: Callable) -> Optional[str]:
    # Large values as well: a clipped activation (gelu_10, a clamped SwiGLU's) agrees with its
    # plain form only up to its limit.
    t = torch.cat((torch.linspace(-6.0, 6.0, 97), torch.tensor([-1e3, -100.0, -20.0, -10.0, 10.0, 20.0, 100.0, 1e3])))
    with torch.no_grad():
        try:
            out = act_fn(t)
        except Exception:
            return None
        for name, fn in forwards.ACTIVATIONS.items():
            if isinstance(out, torch.Tensor) and out.shape == t.shape and torch.allclose(out, fn(t), rtol=1e-6, atol=1e-6):
                return name
    return None


_MLP_OPS = {"silu": ("mlp swiglu", "swiglu"), "gelu_tanh": ("mlp geglu (tanh)", "geglu"), "gelu": ("mlp geglu", "geglu")}


def other_children(module: torch.nn.Module, own: tuple) -> Optional[str]:
    """Why a module holding children besides ``own`` (its projections and activation) is left,
    or None: its forward may apply them where the replacement would not (a dropout in training,
    where the probe, run in eval mode, sees none)."""
    others = sorted(name for name, _ in module.named_children() if name not in own)
    if not others:
        return None
    return (f"it holds {', '.join(others)} besides its projections and activation, which its forward may "
            "apply where kiln's would not")


def classify_mlp(module: torch.nn.Module, original: Callable) -> Union[Match, NoMatch]:
    names, attr = mlp_layout(module)
    gate, up, down = names
    others = other_children(module, names + ((attr,) if attr else ()))
    if others:
        return NoMatch("mlp", others)
    if attr is None:
        return _mlp_of_its_own_activation(module, original, names)
    act_fn = getattr(module, attr)
    act = _identify_activation(act_fn)
    if act is None:
        return NoMatch("mlp", f"its {attr} ({type(act_fn).__name__}) is not SiLU or GELU on a probe")
    kind, op = _MLP_OPS[act]
    if names != MLP_LAYOUTS[0][0]:
        kind = f"{kind} ({', '.join(names)})"
    factory = forwards.gated_mlp(act, attr, names)
    why = compare_with_probe_projections(module, original, factory, attr, _mlp_probe_projections(names))
    if why is not None:
        return NoMatch("mlp", f"does not compute {down}({attr}({gate}(x)) * {up}(x)): {why}")
    return Match(kind, op, factory)


def _mlp_probe_projections(names: tuple) -> tuple:
    gate, up, down = names
    return (gate, _MLP_HIDDEN, _MLP_INNER), (up, _MLP_HIDDEN, _MLP_INNER), (down, _MLP_INNER, _MLP_HIDDEN)


def _mlp_of_its_own_activation(module: torch.nn.Module, original: Callable, names: tuple) -> Union[Match, NoMatch]:
    """A gated MLP whose forward calls its activation itself: the first of SiLU, tanh GELU and
    GELU whose replacement agrees with it on the probe."""
    for act in forwards.ACTIVATIONS:
        factory = forwards.gated_mlp(act, None, names)
        if compare_with_probe_projections(module, original, factory, None, _mlp_probe_projections(names)) is None:
            kind, op = _MLP_OPS[act]
            return Match(f"{kind} ({', '.join(names)})", op, factory)
    gate, up, down = names
    return NoMatch("mlp", f"does not compute {down}(act({gate}(x)) * {up}(x)) with act SiLU or GELU on a probe")


# An MLP probe's widths: its input and output rows, and between its projections.
_MLP_HIDDEN, _MLP_INNER = 24, 40


def compare_with_probe_projections(module: torch.nn.Module, original: Callable, factory: Callable,
                                   attr: Optional[str], projections: tuple) -> Optional[str]:
    """None when the replacement ``factory`` makes agrees with ``original`` on probes run with the
    module's ``projections`` ((name, in, out) each; the first takes the probe's rows) swapped for
    small random ones, in the first's dtype and the others; else why not. The module's ``attr``
    activation is marked as the one probed (:func:`.forwards.remember_activation`), and unmarked
    where they differ."""
    dtype = probe_dtype(getattr(module, projections[0][0]))
    generator = torch.Generator().manual_seed(0)
    children = {name: probe_linear(n_in, n_out, getattr(module, name), dtype, generator)
                for name, n_in, n_out in projections}
    dtypes = (dtype,) + tuple(d for d in _PROBE_DTYPES if d != dtype)
    inputs = with_large_values(_probe_inputs(projections[0][1], dtypes, generator))
    if attr is not None:
        forwards.remember_activation(module, attr)  # the replacement runs kiln's op only for it
    # The last projection sums many rounded products: the bound scales with the output's size.
    with torch.no_grad(), _Swapped(module, children=children):
        why = _compare(original, factory(module, original), inputs, scale_of=lambda out: out.abs().max().item())
    if why is not None and attr is not None:
        forwards.forget_activation(module)
    return why
