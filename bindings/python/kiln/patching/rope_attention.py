"""transformers' attention RoPE (Llama, Mistral, Qwen2, Qwen3, Gemma, DeepSeek-V3, ...).

Those attentions call a module-level ``apply_rotary_pos_emb(q, k, cos, sin)`` from their
forward (``q * cos + rotate_half(q) * sin``, and the same for k: six elementwise kernels
and two concatenations a layer in eager); the multi-head latent attentions of DeepSeek-V3 and
its kin (GLM-4.7-Flash, Mistral 4, LongCat) call ``apply_rotary_pos_emb_interleave`` where their
config sets ``rope_interleave``; Llama 4's and DeepSeek-V2's call ``apply_rotary_emb(q, k,
freqs_cis)``, adjacent pairs turned by complex frequencies (six kernels and a cast each for q and
k); the vision towers of multimodal models call ``apply_rotary_pos_emb_vision`` (see
:mod:`.vision_rope`). kiln does not touch those module-level functions, which every
model of the library shares; the patched attention runs its own class forward, the same code,
with those global names resolved to :func:`rotate_half_rope`'s replacements instead.
Everything else the forward reads (projections, caches, the attention interface) is the
module's own, so a forward that changes between transformers versions needs nothing here.
"""

import inspect
import types
import weakref
from typing import Callable, Optional

import torch

from .. import rope_ops
from .detect import Match, NoMatch
from . import source_rewrite, vision_rope
from .forwards import kiln_can_take
from .rotation_probes import disagreement
from .vision_rope import VISION_GLOBAL

ROPE_GLOBAL = "apply_rotary_pos_emb"
# DeepSeek-V3's: adjacent pairs turned by the first half of its table, written de-interleaved.
DEINTERLEAVE_GLOBAL = "apply_rotary_pos_emb_interleave"
# Llama 4's and DeepSeek-V2's: adjacent pairs as complex numbers times complex64 frequencies
# [B, S, D / 2], broadcast over the heads of q [B, S, H, D] (Llama 4) or [B, H, S, D] (DeepSeek-V2).
COMPLEX_GLOBAL = "apply_rotary_emb"
COMPLEX_LAYOUTS = ("bshd", "bhsd")


# The table forms kiln takes from an ``apply_rotary_pos_emb`` (each told apart on a probe):
# "full", transformers' usual [.., D] table, each angle for both halves; "partial", the same
# table narrower than D, rotating the first columns only (Phi-3's partial_rotary_factor); "half",
# GPT-OSS's [.., D / 2], each angle once; "interleaved", GLM's: pairs of adjacent columns
# rotated by the first half of a [.., R] table (R <= D); "deinterleave", DeepSeek-V3's: pairs of
# adjacent columns rotated by the first half of a [.., D] table and written R/2 apart.
FORMS = ("full", "partial", "half", "interleaved", "deinterleave")


def rope_layout(q, k, cos, sin, unsqueeze_dim, form="full") -> Optional[str]:
    """kiln.rope's layout for transformers' ``apply_rotary_pos_emb`` arguments (1: q of
    ``[B, H, S, D]``, 2: ``[B, S, H, D]``; cos/sin ``[B, S, W]`` or ``[S, W]`` with W as the
    table ``form`` has it), or None where kiln would not compute the same thing with the
    same output dtype. cos and sin must have q's dtype: the formula promotes a bf16 q times an
    fp32 table to fp32, and kiln returns q's dtype."""
    layout = {1: "bhsd", 2: "bshd"}.get(unsqueeze_dim)
    if layout is None or not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin)):
        return None
    # A [S, W] table unsqueezed at 1 lines its positions up with q's heads, not its positions:
    # kiln would compute what the caller meant, not what the formula does.
    if q.dim() != 4 or k.dim() != 4 or cos.dim() not in ((2, 3) if layout == "bshd" else (3,)) \
            or cos.shape != sin.shape:
        return None
    d, width = q.shape[-1], cos.shape[-1]
    if k.shape[-1] != d or d % 2:
        return None
    if form in ("full", "deinterleave"):
        fits = width == d
    elif form == "half":
        fits = 2 * width == d
    else:  # partial or interleaved: the table's width is the rotated columns'
        fits = 0 < width <= d and width % 2 == 0
    if not fits or not kiln_can_take(q, k, cos, sin, differentiable=True):
        return None
    return layout


def _rope_call(args: tuple, kwargs: dict, positional_ok: bool, keyword_ok: bool) -> Optional[tuple]:
    """(q, k, cos, sin, unsqueeze_dim) of a call written ``(q, k, cos, sin)``, with at most an
    ``unsqueeze_dim`` after them where the original gives it that meaning; None for any other
    call (one passing k or the tables by name, or leaving k out, as an indexer rotating q
    alone does)."""
    if len(args) < 4:
        return None
    rest = args[4:]
    if len(rest) + len(kwargs) > 1 or (rest and not positional_ok) \
            or (kwargs and not (keyword_ok and "unsqueeze_dim" in kwargs)):
        return None
    return args[0], args[1], args[2], args[3], kwargs.get("unsqueeze_dim", rest[0] if rest else 1)


def rotate_half_rope(original: Callable, form: str = "full") -> Callable:
    """``apply_rotary_pos_emb`` as one kiln.rope launch for q and k where :func:`rope_layout`
    allows, the ``original`` function otherwise (other signatures included). ``form``: the
    table form the original takes (:data:`FORMS`), and so does kiln."""

    # An argument after (q, k, cos, sin) is read only where the original gives it that
    # meaning (older versions took position_ids fifth).
    names = _parameters(original)
    positional_ok = names[4:5] == ["unsqueeze_dim"]
    keyword_ok = "unsqueeze_dim" in names

    # The table form is spelled in code, not read from this closure: torch.compile guards
    # on what the traced path reads, and it finds this function through the model's module
    # globals, where the name is the original's (whose closure has no such cell). Each form's
    # body is written out: torch.compile (2.11) fails with an internal TypeError tracing one
    # helper given the call's args and kwargs.
    def apply_rotary_pos_emb(*args, **kwargs):
        call = _rope_call(args, kwargs, positional_ok, keyword_ok)
        layout = None if call is None else rope_layout(*call)
        if layout is None:
            return original(*args, **kwargs)
        q, k, cos, sin, _ = call
        return rope_ops.rope(q, k, cos, sin, layout=layout)

    def apply_rotary_pos_emb_partial(*args, **kwargs):
        call = _rope_call(args, kwargs, positional_ok, keyword_ok)
        layout = None if call is None else rope_layout(*call, "partial")
        if layout is None:
            return original(*args, **kwargs)
        q, k, cos, sin, _ = call
        return rope_ops.rope(q, k, cos, sin, layout=layout)  # rotary_dim: the table's width

    def apply_rotary_pos_emb_half_table(*args, **kwargs):
        call = _rope_call(args, kwargs, positional_ok, keyword_ok)
        layout = None if call is None else rope_layout(*call, "half")
        if layout is None:
            return original(*args, **kwargs)
        q, k, cos, sin, _ = call
        return rope_ops.rope(q, k, cos, sin, rotary_dim=q.shape[-1], layout=layout)

    def apply_rotary_pos_emb_interleaved(*args, **kwargs):
        call = _rope_call(args, kwargs, positional_ok, keyword_ok)
        layout = None if call is None else rope_layout(*call, "interleaved")
        if layout is None:
            return original(*args, **kwargs)
        # GLM's table holds each pair's angle in its first half (the second repeats it).
        q, k, cos, sin, _ = call
        rotary_dim = cos.shape[-1]
        half = rotary_dim // 2
        return rope_ops.rope(q, k, cos[..., :half], sin[..., :half], interleaved=True, rotary_dim=rotary_dim,
                             layout=layout)

    def apply_rotary_pos_emb_deinterleave(*args, **kwargs):
        call = _rope_call(args, kwargs, positional_ok, keyword_ok)
        layout = None if call is None else rope_layout(*call, "deinterleave")
        if layout is None:
            return original(*args, **kwargs)
        # DeepSeek's table repeats each pair's angle in its second half.
        q, k, cos, sin, _ = call
        half = cos.shape[-1] // 2
        return rope_ops.rope(q, k, cos[..., :half], sin[..., :half], rotary_dim=q.shape[-1], layout=layout,
                             deinterleave=True)

    replacement = {"full": apply_rotary_pos_emb, "partial": apply_rotary_pos_emb_partial,
                   "half": apply_rotary_pos_emb_half_table, "interleaved": apply_rotary_pos_emb_interleaved,
                   "deinterleave": apply_rotary_pos_emb_deinterleave}[form]
    replacement.__wrapped__ = original
    return replacement


def _complex_fits(q, k, freqs, heads_dim: int) -> bool:
    """Whether kiln.rope computes ``apply_rotary_emb(q, k, freqs)`` for q and k with their heads
    at ``heads_dim`` (2: [B, S, H, D]; 1: [B, H, S, D]) and freqs complex64 [B or 1, S, D / 2]."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, freqs)) or freqs.dtype != torch.complex64 \
            or q.dim() != 4 or k.dim() != 4 or freqs.dim() != 3 or q.shape[-1] % 2 or k.shape[-1] != q.shape[-1]:
        return False
    seq_dim = 3 - heads_dim
    return 2 * freqs.shape[-1] == q.shape[-1] and freqs.device == q.device \
        and k.shape[0] == q.shape[0] and freqs.shape[0] in (1, q.shape[0]) \
        and q.shape[seq_dim] == freqs.shape[1] == k.shape[seq_dim] and kiln_can_take(q, k, differentiable=True)


def complex_rope(original: Callable, layout: str) -> Callable:
    """``apply_rotary_emb(q, k, freqs_cis)`` as one kiln.rope launch (interleaved pairs, the
    frequencies' real and imaginary parts as a half table, math in fp32 and q's dtype out as the
    original's ``type_as``) where q and k are 4-D in ``layout`` and ``freqs_cis`` is complex64
    [B, S, D / 2]; the ``original`` otherwise."""

    # Written out per layout, as rotate_half_rope's forms are, and for the same reasons.
    def apply_rotary_emb(*args, **kwargs):
        if len(args) != 3 or kwargs:
            return original(*args, **kwargs)
        q, k, freqs = args
        if not _complex_fits(q, k, freqs, 2):
            return original(*args, **kwargs)
        table = torch.view_as_real(freqs)
        return rope_ops.rope(q, k, table[..., 0], table[..., 1], interleaved=True, rotary_dim=q.shape[-1],
                             layout="bshd")

    def apply_rotary_emb_bhsd(*args, **kwargs):
        if len(args) != 3 or kwargs:
            return original(*args, **kwargs)
        q, k, freqs = args
        if not _complex_fits(q, k, freqs, 1):
            return original(*args, **kwargs)
        table = torch.view_as_real(freqs)
        return rope_ops.rope(q, k, table[..., 0], table[..., 1], interleaved=True, rotary_dim=q.shape[-1],
                             layout="bhsd")

    replacement = apply_rotary_emb if layout == "bshd" else apply_rotary_emb_bhsd
    replacement.__wrapped__ = original
    return replacement


def _parameters(function: Callable) -> list:
    try:
        return list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return []


def rope_globals(function: object) -> list:
    """The rotary functions (``apply_rotary_pos_emb``, ``apply_rotary_pos_emb_interleave``,
    ``apply_rotary_emb``, ``apply_rotary_pos_emb_vision``) ``function`` calls by global name,
    where it is plain Python code (not a decorator's wrapper, whose own globals are not the
    ones the wrapped code reads)."""
    if not isinstance(function, types.FunctionType) or hasattr(function, "__wrapped__"):
        return []
    return [name for name in (ROPE_GLOBAL, DEINTERLEAVE_GLOBAL, COMPLEX_GLOBAL, VISION_GLOBAL)
            if name in function.__code__.co_names and callable(function.__globals__.get(name))]


def uses_rope_global(function: object) -> bool:
    """Whether ``function`` is plain Python code that calls a global ``apply_rotary_pos_emb``."""
    return ROPE_GLOBAL in rope_globals(function)


# One kiln copy per class forward, shared by every patched attention of that class, with the
# global names it replaces.
_KILN_COPIES: "weakref.WeakKeyDictionary[types.FunctionType, tuple]" = weakref.WeakKeyDictionary()


def with_kiln_rope(function: types.FunctionType, form: Optional[str] = "full",
                   deinterleave: bool = False, complex_layout: Optional[str] = None,
                   vision: Optional[vision_rope.VisionForm] = None) -> types.FunctionType:
    """A copy of ``function`` whose global ``apply_rotary_pos_emb`` (unless ``form`` is None),
    with ``deinterleave`` ``apply_rotary_pos_emb_interleave``, with a ``complex_layout``
    ``apply_rotary_emb`` and with a ``vision`` form ``apply_rotary_pos_emb_vision`` are kiln's (made
    once per function; a class's rotary function takes one table form). The copy reads a snapshot of
    the function's module globals, brought up to date at each call (a name rebound in that
    module after the last kiln.patch is not seen; objects mutated in place, like transformers'
    attention registry, are)."""
    kept = _KILN_COPIES.get(function)
    if kept is not None:
        copy, names = kept
        source_rewrite.refresh(copy.__globals__, function, {name: copy.__globals__[name] for name in names})
        return copy
    scope = source_rewrite.module_scope(function, "rope")
    names = []
    if form is not None:
        scope[ROPE_GLOBAL] = rotate_half_rope(function.__globals__[ROPE_GLOBAL], form)
        names.append(ROPE_GLOBAL)
    if deinterleave:
        scope[DEINTERLEAVE_GLOBAL] = rotate_half_rope(function.__globals__[DEINTERLEAVE_GLOBAL], "deinterleave")
        names.append(DEINTERLEAVE_GLOBAL)
    if complex_layout is not None:
        scope[COMPLEX_GLOBAL] = complex_rope(function.__globals__[COMPLEX_GLOBAL], complex_layout)
        names.append(COMPLEX_GLOBAL)
    if vision is not None:
        scope[VISION_GLOBAL] = vision_rope.vision_rope(function.__globals__[VISION_GLOBAL], vision)
        names.append(VISION_GLOBAL)
    copy = types.FunctionType(function.__code__, scope, function.__name__, function.__defaults__,
                              function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__qualname__, copy.__doc__ = function.__qualname__, function.__doc__
    _KILN_COPIES[function] = (copy, names)
    return copy


def candidate(module: torch.nn.Module) -> bool:
    """A module (an attention: Llama's with ``q_proj`` and ``k_proj``, Phi-3's with one
    ``qkv_proj``, DeepSeek-V3's latent one, Llama 4's, a vision tower's) whose class forward
    calls a global ``apply_rotary_pos_emb``, ``apply_rotary_pos_emb_interleave``,
    ``apply_rotary_emb`` or ``apply_rotary_pos_emb_vision``."""
    return bool(rope_globals(type(module).forward))


def probe(dtype: torch.dtype, generator: torch.Generator, form: str = "full", dim: int = 8):
    """q [B, H, S, D], k with fewer heads (grouped-query attention), and cos/sin as
    transformers' rotary embeddings make them for the table ``form`` (:data:`FORMS`): [B, S, W],
    W = D, or D / 2 for the partial and interleaved forms, each angle used for both halves; or
    (half, GPT-OSS's) [B, S, D / 2], each angle once."""
    q = torch.randn(2, 4, 5, dim, generator=generator)
    k = torch.randn(2, 2, 5, dim, generator=generator)
    rotated = dim if form in ("full", "half", "deinterleave") else dim // 2
    angles = torch.rand(2, 5, rotated // 2, generator=generator) * 20.0
    emb = angles if form == "half" else torch.cat((angles, angles), dim=-1)
    return [t.to(dtype) for t in (q, k, emb.cos(), emb.sin())]


def _compare(function: Callable, form: str):
    """None when ``function`` computes what kiln.rope computes on random probes of the table
    form (fp32 and bf16); else (whether the function itself failed on the probe, the reason)."""
    generator = torch.Generator().manual_seed(0)
    probes = (("", tuple(probe(dtype, generator, form))) for dtype in (torch.float32, torch.bfloat16))
    return disagreement(function, rotate_half_rope(function, form), probes)


def _compare_complex(function: Callable, layout: str) -> Optional[str]:
    """None when ``function(q, k, freqs_cis)`` computes what kiln.rope computes with q and k in
    ``layout`` on random probes (fp32 and bf16; q with more heads than k, and batch, heads and
    positions of different sizes, so that broadcasting over the wrong axis fails); else why not."""
    generator = torch.Generator().manual_seed(0)
    shape_q, shape_k = ((2, 5, 4, 8), (2, 5, 2, 8)) if layout == "bshd" else ((2, 4, 5, 8), (2, 2, 5, 8))

    def probes():
        for dtype in (torch.float32, torch.bfloat16):
            q = torch.randn(shape_q, generator=generator).to(dtype)
            k = torch.randn(shape_k, generator=generator).to(dtype)
            freqs = torch.polar(torch.ones(2, 5, 4), torch.rand(2, 5, 4, generator=generator) * 20.0)
            yield f"[{layout}] ", (q, k, freqs)

    found = disagreement(function, complex_rope(function, layout), probes())
    return None if found is None else found[1]


def _complex_layout(function: Callable) -> tuple:
    """(the layout of q and k ``apply_rotary_emb`` broadcasts its frequencies over, what the
    report calls it), or (None, why not)."""
    reasons = []
    for layout in COMPLEX_LAYOUTS:
        why = _compare_complex(function, layout)
        if why is None:
            return layout, f"adjacent pairs by complex frequencies ({COMPLEX_GLOBAL}, q and k [{layout}])"
        reasons.append(why)
    return None, f"its {COMPLEX_GLOBAL} is not RoPE by complex frequencies: {'; '.join(reasons)}"


def _rope_form(function: Callable) -> tuple:
    """(the table form kiln takes ``apply_rotary_pos_emb`` in, what the report calls it), or
    (None, why not): the usual form where probes of it agree, and then whether it also rotates
    the first columns only given a narrower table; where it fails on those, GPT-OSS's; where it
    computes something else, GLM's interleaved pairs."""
    mismatch = _compare(function, "full")
    if mismatch is None:
        if _compare(function, "partial") is None:
            return "partial", "rotate_half, the first rotary_dim columns"
        return "full", "rotate_half"
    failed_on_probe, reason = mismatch
    if failed_on_probe and _compare(function, "half") is None:
        return "half", "rotate_half, one angle a pair"
    if _compare(function, "interleaved") is None:
        return "interleaved", "interleaved pairs, the first rotary_dim columns"
    return None, f"its apply_rotary_pos_emb is neither rotate_half nor interleaved RoPE: {reason}"


def classify(module: torch.nn.Module, original: Callable):
    """A Match when the rotary functions the module's forward calls compute what kiln.rope
    computes on random probes (fp32 and bf16): ``apply_rotary_pos_emb`` in one of the table
    forms (:data:`FORMS`, see :func:`_rope_form`), ``apply_rotary_pos_emb_interleave`` as
    DeepSeek-V3's de-interleaving form. Each that agrees is replaced; a NoMatch with the
    reasons where none does."""
    if getattr(original, "__func__", None) is not type(module).forward \
            or getattr(original, "__self__", None) is not module:
        return NoMatch("rope", "its forward is not its class's own (something else wraps it)")
    forward = type(module).forward
    names = rope_globals(forward)
    form, kinds, reasons = None, [], []
    if ROPE_GLOBAL in names:
        form, text = _rope_form(forward.__globals__[ROPE_GLOBAL])
        (kinds if form is not None else reasons).append(text)
    deinterleave = False
    if DEINTERLEAVE_GLOBAL in names:
        mismatch = _compare(forward.__globals__[DEINTERLEAVE_GLOBAL], "deinterleave")
        if mismatch is None:
            deinterleave = True
            kinds.append(f"adjacent pairs written de-interleaved (DeepSeek's {DEINTERLEAVE_GLOBAL})")
        else:
            reasons.append(f"its {DEINTERLEAVE_GLOBAL} is not DeepSeek-V3's de-interleaving RoPE: {mismatch[1]}")
    complex_layout = None
    if COMPLEX_GLOBAL in names:
        complex_layout, text = _complex_layout(forward.__globals__[COMPLEX_GLOBAL])
        (kinds if complex_layout is not None else reasons).append(text)
    vision = None
    if VISION_GLOBAL in names:
        vision, text = vision_rope.compare(forward.__globals__[VISION_GLOBAL])
        if vision is not None:
            kinds.append(f"{text} ({VISION_GLOBAL})")
        else:
            reasons.append(f"its {VISION_GLOBAL} is not replaced: {text}")
    if not kinds:
        return NoMatch("rope", "; ".join(reasons))
    kind = f"rope ({'; '.join(kinds)}, in the attention's forward)"
    if not deinterleave and complex_layout is None and vision is None:
        return Match(kind, "rope", _FACTORIES[form])

    def other_globals_factory(module: torch.nn.Module, original: Callable) -> Callable:
        return with_kiln_rope(type(module).forward, form, deinterleave=deinterleave,
                              complex_layout=complex_layout, vision=vision).__get__(module)

    return Match(kind, "rope", other_globals_factory)


def factory(module: torch.nn.Module, original: Callable) -> Callable:
    return with_kiln_rope(type(module).forward).__get__(module)


def partial_factory(module: torch.nn.Module, original: Callable) -> Callable:
    return with_kiln_rope(type(module).forward, "partial").__get__(module)


def half_table_factory(module: torch.nn.Module, original: Callable) -> Callable:
    return with_kiln_rope(type(module).forward, "half").__get__(module)


def interleaved_factory(module: torch.nn.Module, original: Callable) -> Callable:
    return with_kiln_rope(type(module).forward, "interleaved").__get__(module)


_FACTORIES = {"full": factory, "partial": partial_factory, "half": half_table_factory,
              "interleaved": interleaved_factory}
