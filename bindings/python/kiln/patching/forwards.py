"""The replacement forwards, one per computation kiln.patch recognises.

Each factory takes the module and its original (inner) forward and returns a function of
the forward's arguments. The replacement calls a kiln op where that op computes the same
thing under the module's own dtype rule, and the original forward everywhere else: other
arguments, dtypes or devices kiln has no kernel for. The forwards here use ops with backward
formulas (rms_norm, layer_norm, swiglu, geglu, gelu), so they also serve calls that record an
autograd graph (training), as FLUX's AdaLN and RoPE forwards do (flux.py); LTX-Video's fused
forwards (ltx.py) use ops that have none and keep the original there.
"""

import inspect
from typing import Callable, Optional

import torch
import torch.nn.functional as F
import torch.autograd.forward_ad as _forward_ad
import torch.nn.modules.module as _module_hooks

_functorch_stack = torch._C._functorch.peek_interpreter_stack

from .. import activation_ops, norm_ops, ops

_KILN_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_KILN_DEVICES = ("cpu", "cuda")


def _transformed() -> bool:
    """Whether a forward-mode AD level or a torch.func transform (jvp, grad, vmap) is active:
    kiln's ops have no forward derivatives and their autograd functions refuse functorch's
    wrapped tensors, so the originals run there. Tracing for torch.compile can run under a
    functorch interpreter of its own, which is not one of those (and is asked about last:
    is_compiling is the dearest of the three reads)."""
    if _forward_ad._current_level >= 0:
        return True
    return _functorch_stack() is not None and not torch.compiler.is_compiling()


def kiln_can_take(*tensors: torch.Tensor, differentiable: bool = False) -> bool:
    """Whether one kiln call may take these tensors: floating dtypes kiln has kernels for,
    a device it runs on, one dtype and one device for all, none nested (kiln's ops take
    dense rows; the original modules handle jagged batches), no forward-mode AD or
    torch.func transform, and (unless the ops the caller uses are ``differentiable``) no
    graph to record."""
    first = tensors[0]
    dtype, device = first.dtype, first.device
    # A nested operand comes with a nested first one (the activations the call is about),
    # so the first alone is asked: each question costs every patched call.
    if dtype not in _KILN_DTYPES or device.type not in _KILN_DEVICES or first.is_nested \
            or _transformed():
        return False
    for t in tensors:
        if t.dtype != dtype or t.device != device:
            return False
    if differentiable:
        return True
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def records_parameters(module: torch.nn.Module) -> bool:
    """Whether autograd would record a gradient for one of the module's parameters in this
    call (a block whose fused seams have no backward then runs its original forward)."""
    return torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())


def recording_a_graph(like: torch.Tensor) -> bool:
    """Whether this call is being recorded rather than run: traced by torch.compile, or
    captured into a CUDA graph on like's device. A tensor kept between calls must not be
    made there (a capture records the kernel that fills it without running it) nor read
    there (a replay would read it after a later call freed or changed it)."""
    return torch.compiler.is_compiling() or (like.is_cuda and torch.cuda.is_current_stream_capturing())


def kept_while_unchanged(cache: dict, name: str, sources: tuple, like: torch.Tensor, make: Callable):
    """``make()``, kept in ``cache[name]`` while ``sources`` (tensors, held and compared by
    identity: an id alone could be a replaced parameter's, reused) keep their version counters;
    made afresh where a graph is recorded or a source is an inference tensor (no counter)."""
    if recording_a_graph(like) or any(t.is_inference() for t in sources if isinstance(t, torch.Tensor)):
        return make()
    versions = tuple(t._version if isinstance(t, torch.Tensor) else None for t in sources)
    key = (like.shape[-1], like.dtype, like.device)
    held = cache.get(name)
    if held is None or held[2] != key or held[1] != versions or any(a is not b for a, b in zip(held[0], sources)):
        held = (sources, versions, key, make())
        cache[name] = held
    return held[3]


class SharedAttentionSettings:
    """For a processor kiln installs in place of ``self.original``: diffusers sets the attention
    backend and the parallel settings on every processor of a model; set on either processor,
    both see them."""

    @property
    def _attention_backend(self):
        return getattr(self.original, "_attention_backend", None)

    @_attention_backend.setter
    def _attention_backend(self, value):
        self.original._attention_backend = value

    @property
    def _parallel_config(self):
        return getattr(self.original, "_parallel_config", None)

    @_parallel_config.setter
    def _parallel_config(self, value):
        self.original._parallel_config = value


def signature_kept(cls: type) -> type:
    """diffusers' attention modules read their processor's ``__call__`` signature on every
    call (to drop keyword arguments it does not take); set on the function once, inspect
    returns it without introspecting the code each time."""
    cls.__call__.__signature__ = inspect.signature(cls.__call__)
    return cls


def norm_eps(module: torch.nn.Module, x: torch.Tensor) -> float:
    """transformers names it ``variance_epsilon``, torch and diffusers ``eps``; torch's
    ``nn.RMSNorm`` takes ``eps=None`` as the input dtype's machine epsilon."""
    eps = getattr(module, "variance_epsilon", None)
    if eps is None:
        eps = getattr(module, "eps", None)
    return float(torch.finfo(x.dtype).eps if eps is None else eps)


def _single_tensor_call(args, kwargs) -> bool:
    return len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor)


_HALF_DTYPES = (torch.float16, torch.bfloat16)


def _fp32_input_half_weight(x: torch.Tensor, weight: Optional[torch.Tensor]) -> bool:
    return weight is not None and x.dtype == torch.float32 and weight.dtype in _HALF_DTYPES \
        and weight.device == x.device


def rms_norm_plain(module: torch.nn.Module, original: Callable) -> Callable:
    """``x * rsqrt(mean(x^2) + eps) * weight`` rounded once to x's dtype (``nn.RMSNorm``,
    or a norm with no weight). An fp32 x with a half weight (an fp32 residual stream, as
    Inkling 2's) multiplies in fp32 by the weight's exact fp32 value: one fp32 call. A weight
    of another dtype otherwise keeps the original forward."""

    def forward(*args, **kwargs):
        if not _single_tensor_call(args, kwargs):
            return original(*args, **kwargs)
        x = args[0]
        weight = module.weight if isinstance(getattr(module, "weight", None), torch.Tensor) else None
        if _fp32_input_half_weight(x, weight) and kiln_can_take(x, differentiable=True):
            return ops.rms_norm(x, _fp32_weight(module), norm_eps(module, x))
        tensors = (x,) if weight is None else (x, weight)
        if not kiln_can_take(*tensors, differentiable=True):
            return original(x)
        return ops.rms_norm(x, weight, norm_eps(module, x))

    return forward


def rms_norm_gamma(module: torch.nn.Module, original: Callable) -> Callable:
    """An RMSNorm whose scale is named ``gamma`` (Stable Audio 3's ``StableAudio3RMSNorm``:
    normalised and scaled in fp32, rounded once to x's dtype): one kiln call where gamma has
    x's dtype; the original forward otherwise, and under torch.compile, where Inductor fuses the
    norm into the modulation or rotation after it and reads the attentions' q and k in place in
    their packed projection, which kiln's norm would copy out first (a step of the model took
    twice the compiled time with kiln's norms there: BENCHMARKS.md, Stable Audio 3)."""

    def forward(*args, **kwargs):
        if not _single_tensor_call(args, kwargs) or torch.compiler.is_compiling():
            return original(*args, **kwargs)
        x = args[0]
        gamma = getattr(module, "gamma", None)
        if not isinstance(gamma, torch.Tensor) or gamma.shape != x.shape[-1:] \
                or not kiln_can_take(x, gamma, differentiable=True):
            return original(x)
        return ops.rms_norm(x, gamma, norm_eps(module, x))

    return forward


def rms_norm_llama(module: torch.nn.Module, original: Callable) -> Callable:
    """transformers' ``LlamaRMSNorm`` (and the Mistral, Qwen2, Qwen3 copies of it):
    ``weight * normalized.to(input_dtype)``, the output dtype the promotion of the weight's
    and the input's. With one dtype that is one kiln call (kiln rounds once, after the
    weight multiply, where the original rounds before it too: at most an ulp apart). An fp32
    input with a half weight is one fp32 call too: nothing rounds before the product, which
    promotes to fp32. With other pairs, kiln normalises and rounds to the input dtype and the
    weight multiplies after, in the promoted dtype, as the original does."""

    def forward(*args, **kwargs):
        if not _single_tensor_call(args, kwargs):
            return original(*args, **kwargs)
        x = args[0]
        weight = module.weight
        if weight.device != x.device or not kiln_can_take(x, differentiable=True):
            return original(x)
        eps = norm_eps(module, x)
        if weight.dtype == x.dtype and kiln_can_take(x, weight, differentiable=True):
            return ops.rms_norm(x, weight, eps)
        if _fp32_input_half_weight(x, weight):
            return ops.rms_norm(x, _fp32_weight(module), eps)
        return weight * ops.rms_norm(x, None, eps)

    return forward


def rms_norm_diffusers(module: torch.nn.Module, original: Callable) -> Callable:
    """diffusers' ``RMSNorm`` with a weight: normalised in fp32; a half-precision weight
    rounds that to its own dtype before multiplying (the output has the weight's dtype
    whatever the input's), an fp32 weight multiplies in fp32 (the output is fp32). With x
    and a half weight of one dtype that is one kiln call (rounded once where the original
    rounds twice: at most an ulp apart); otherwise kiln normalises x in fp32 and the rest
    is the original's own rounding and multiply."""

    def forward(*args, **kwargs):
        if not _single_tensor_call(args, kwargs):
            return original(*args, **kwargs)
        x = args[0]
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or getattr(module, "bias", None) is not None:
            return original(x)
        if weight.device != x.device or not kiln_can_take(x, differentiable=True):
            return original(x)
        eps = norm_eps(module, x)
        if weight.dtype in _HALF_DTYPES:
            if x.dtype == weight.dtype:
                return ops.rms_norm(x, weight, eps)
            return ops.rms_norm(x.float(), None, eps).to(weight.dtype) * weight
        if weight.dtype == torch.float32:
            return ops.rms_norm(x.float(), weight, eps)
        return original(x)

    return forward


def layer_norm(module: torch.nn.Module, original: Callable) -> Callable:
    """``F.layer_norm`` over the last dimension, weight and bias optional (``nn.LayerNorm``
    with or without ``elementwise_affine``), rounded once to x's dtype. Parameters of
    another dtype than x keep the original forward."""

    def forward(*args, **kwargs):
        if not _single_tensor_call(args, kwargs):
            return original(*args, **kwargs)
        x = args[0]
        params = [getattr(module, n, None) for n in ("weight", "bias")]
        weight, bias = [p if isinstance(p, torch.Tensor) else None for p in params]
        shape = getattr(module, "normalized_shape", None)
        if x.dim() == 0 or (shape is not None and tuple(shape) != (x.shape[-1],)):
            return original(x)
        if not kiln_can_take(x, *[p for p in (weight, bias) if p is not None], differentiable=True):
            return original(x)
        return norm_ops.layer_norm(x, weight, bias, norm_eps(module, x))

    return forward


def gelu_after_proj(module: torch.nn.Module, original: Callable) -> Callable:
    """diffusers' ``GELU``: ``F.gelu(proj(x), approximate=module.approximate)``. The
    projection stays the module's own; the activation is ``kiln.gelu``, or, for the tanh
    form on CUDA, the GEMM's own epilogue (``_gemm_gelu_epilogue``). The projection's bias
    stays in the projection: moving it into ``kiln.gelu`` would round the matmul to x's
    dtype before the bias is added, which the original does not."""

    def forward(*args, **kwargs):
        if not _single_tensor_call(args, kwargs):
            return original(*args, **kwargs)
        approximate = getattr(module, "approximate", None)
        if approximate not in ("tanh", "none"):
            return original(*args)
        if approximate == "tanh":
            fused = _gemm_gelu_epilogue(module.proj, args[0])
            if fused is not None:
                return fused
        hidden = module.proj(args[0])
        if not kiln_can_take(hidden, differentiable=True):
            return module.gelu(hidden)
        return activation_ops.gelu(hidden, None, approximate)

    return forward


def argument_binder(original: Callable, defaults: bool = False) -> Callable[[tuple, dict], Optional[dict]]:
    """For a replacement that reads the original forward's arguments by name: a function of
    one call's (args, kwargs) giving them (with ``defaults``, those not given at their
    defaults too), or None where they do not bind (the replacement then calls the original,
    which raises as it would have)."""
    signature = inspect.signature(original)

    def bind(args: tuple, kwargs: dict) -> Optional[dict]:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return None
        if defaults:
            bound.apply_defaults()
        return bound.arguments

    return bind


def torch_hooks(module: torch.nn.Module) -> bool:
    """Whether torch runs forward hooks around the module's forward (its own or global ones)."""
    return bool(module._forward_hooks or module._forward_pre_hooks
                or _module_hooks._global_forward_hooks or _module_hooks._global_forward_pre_hooks)


def any_hooks(module: torch.nn.Module) -> bool:
    """Whether a hook runs around the module's forward: torch's, accelerate's or diffusers'
    (which may change its inputs or outputs, move its weights, or split its outputs for
    context parallelism)."""
    return torch_hooks(module) or hasattr(module, "_hf_hook") or diffusers_hooks(module)


def diffusers_hooks(module: torch.nn.Module) -> bool:
    """Whether diffusers' hooks run around the module's forward (its registry stays on the
    module, empty, once they are removed, and on a model that set a cache context)."""
    return bool(getattr(module.__dict__.get("_diffusers_hook"), "hooks", None))


def fused_head_norms(norms, x: torch.Tensor, *tensors: torch.Tensor):
    """(the norms' weights, their one eps) where one ``kiln.head_norm_rope`` computes what the
    per-head RMSNorms ``norms`` of x [..., D] compute (each norm present with no hook around it,
    its weight None or a [D] tensor kiln takes with x and ``tensors``, one eps for all); else None.
    The caller knows the norms are RMSNorms kiln computes (checked when patched)."""
    if any(n is None or any_hooks(n) for n in norms):
        return None
    weights = [getattr(n, "weight", None) for n in norms]
    given = [w for w in weights if w is not None]
    if any(not isinstance(w, torch.Tensor) or w.shape != (x.shape[-1],) for w in given) \
            or not kiln_can_take(x, *tensors, *given):
        return None
    eps = {norm_eps(n, x) for n in norms}
    return (weights, eps.pop()) if len(eps) == 1 else None


def _gemm_gelu_epilogue(proj: torch.nn.Module, x: torch.Tensor) -> Optional[torch.Tensor]:
    """``gelu(proj(x), approximate="tanh")`` as one cuBLASLt GEMM whose epilogue adds the bias
    to the fp32 accumulator and applies the GELU before the single rounding, so the
    projection's output never makes a round trip through memory (in LTX-Video's feed-forward
    that round trip is 4 of every 5 bytes its activation moves). None where that would not
    compute what the module does: off CUDA (the CPU kernel of ``_addmm_activation`` applies
    the erf form), for anything but a plain ``nn.Linear`` with a bias called without hooks
    (an offload hook moves the weights in the forward it wraps), and where autograd records
    (the op has no backward)."""
    if not x.is_cuda or x.dim() < 2 or x.numel() == 0 or type(proj) is not torch.nn.Linear:
        return None
    weight, bias = proj.weight, proj.bias
    if bias is None or not kiln_can_take(x, weight, bias):
        return None
    if "forward" in proj.__dict__ or torch_hooks(proj):
        return None
    flat = x.reshape(-1, x.shape[-1])
    out = torch._addmm_activation(bias, flat, weight.t(), use_gelu=True)
    return out.view(*x.shape[:-1], weight.shape[0])


KEPT_WEIGHT = "_kiln_kept_weight"


def _kept_weight(module: torch.nn.Module, dtype: torch.dtype, make: Callable) -> torch.Tensor:
    """``make(weight)`` in ``dtype``, the form of the module's weight its kiln call takes, kept
    between calls and made again when the weight changes: in place (its version counter
    moves), given new data through ``weight.data = ...`` (which moves no counter, but the
    address changes), or replaced (another tensor, told apart by identity, since a new tensor
    may take the freed one's address). An in-place write through ``weight.data`` moves
    neither, as autograd does not see it either: the README says how to drop what is kept
    after one. Made inside the graph where autograd records one for the weight, so that the
    weight gets its gradient."""
    weight = module.weight
    if (torch.is_grad_enabled() and weight.requires_grad) or recording_a_graph(weight):
        # (A tensor made while a CUDA graph records is filled only when the graph runs.)
        return make(weight).to(dtype)
    try:
        key = (weight._version, weight.data_ptr(), weight.device, dtype)
    except RuntimeError:  # an inference-mode tensor has no version counter
        return make(weight).to(dtype)
    cached = module.__dict__.get(KEPT_WEIGHT)
    if cached is not None and cached[0] is weight and cached[1] == key:
        return cached[2]
    with torch.no_grad():
        value = make(weight).to(dtype)
    module.__dict__[KEPT_WEIGHT] = (weight, key, value)
    return value


def _offset_weight(module: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """Gemma's ``1 + weight.float()`` in ``dtype``, kept (_kept_weight)."""
    return _kept_weight(module, dtype, lambda weight: 1.0 + weight.float())


def _fp32_weight(module: torch.nn.Module) -> torch.Tensor:
    """A half weight's exact fp32 value, kept (_kept_weight)."""
    return _kept_weight(module, torch.float32, lambda weight: weight)


def rms_norm_offset(module: torch.nn.Module, original: Callable) -> Callable:
    """Gemma's RMSNorm: ``(normalized * (1 + weight.float())).type_as(x)``, math in fp32.
    kiln takes ``1 + weight`` rounded to x's dtype (exact for fp32; for fp16/bf16 within an
    ulp of the output, the same order as the output's own rounding)."""

    def forward(*args, **kwargs):
        if not _single_tensor_call(args, kwargs):
            return original(*args, **kwargs)
        x = args[0]
        weight = module.weight
        if weight.device != x.device or not kiln_can_take(x, differentiable=True):
            return original(x)
        return ops.rms_norm(x, _offset_weight(module, x.dtype), norm_eps(module, x))

    return forward


def gated_mlp(act: str, attr: Optional[str] = "act_fn",
              names: tuple = ("gate_proj", "up_proj", "down_proj")) -> Callable:
    """``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with the ``act_fn(gate) * up`` part
    as one kiln call (``act``: ``"silu"``, ``"gelu_tanh"`` or ``"gelu"``; ``attr``: the
    attribute the module keeps its activation in, None where its forward calls ``act`` itself;
    ``names``: its gate, up and down projections' attributes); the projections are the module's
    own."""
    gate_name, up_name, down_name = names

    def fuse(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if act == "silu":
            return activation_ops.swiglu(gate, up)
        return activation_ops.geglu(gate, up, approximate="tanh" if act == "gelu_tanh" else "none")

    def factory(module: torch.nn.Module, original: Callable) -> Callable:
        def forward(*args, **kwargs):
            if not _single_tensor_call(args, kwargs):
                return original(*args, **kwargs)
            x = args[0]
            gate = getattr(module, gate_name)(x)
            up = getattr(module, up_name)(x)
            act_fn = ACTIVATIONS[act] if attr is None else getattr(module, attr)
            if gate.shape == up.shape and (attr is None or runs_probed_activation(module, act_fn)) \
                    and kiln_can_take(gate, up, differentiable=True):
                hidden = fuse(gate, up)
            else:
                hidden = act_fn(gate) * up
            return getattr(module, down_name)(hidden)

        return forward

    return factory


ACTIVATION_MARK = "_kiln_activation"


def remember_activation(module: torch.nn.Module, attr: str) -> None:
    """Marks on the module the activation its probe identified (its ``attr``: a module, or a
    method of the module itself), for :func:`runs_probed_activation`. Kept on the module: a
    deep copy copies the mark with it, pointing at the copy's own activation."""
    act = getattr(module, attr)
    module.__dict__[ACTIVATION_MARK] = act.__func__ if getattr(act, "__self__", None) is module else act


def forget_activation(module: torch.nn.Module) -> None:
    module.__dict__.pop(ACTIVATION_MARK, None)


def runs_probed_activation(module: torch.nn.Module, now: Callable) -> bool:
    """Whether ``now``, the module's activation read at call time, is the one marked: the same
    module, with no hook and no forward of its own set since, or the same method of the module
    (a bound method is made anew at each read)."""
    probed = module.__dict__.get(ACTIVATION_MARK)
    if probed is None:
        return False
    if now is probed:
        return not (isinstance(now, torch.nn.Module) and ("forward" in now.__dict__ or any_hooks(now)))
    return getattr(now, "__self__", None) is module and getattr(now, "__func__", None) is probed


# The activations a gated MLP's act_fn is recognised as, by what it computes.
ACTIVATIONS = {
    "silu": F.silu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "gelu": lambda t: F.gelu(t, approximate="none"),
}

# The kiln op (and its GELU form) that gates one packed [..., 2I] tensor, for each activation.
PACKED_OPS = {"silu": ("swiglu", "none"), "gelu_tanh": ("geglu", "tanh"), "gelu": ("geglu", "none")}


def gate_packed(activation: str, packed: torch.Tensor, up_first: bool) -> torch.Tensor:
    """``act(gate) * up`` over ``packed``'s two halves as one kiln call (``activation``: a key
    of :data:`PACKED_OPS`; ``up_first``: the first half is up)."""
    op, approximate = PACKED_OPS[activation]
    if op == "swiglu":
        return activation_ops.swiglu(packed, None, up_first)
    return activation_ops.geglu(packed, None, approximate, up_first)
