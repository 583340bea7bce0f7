"""The vision towers' RoPE of transformers' multimodal models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
Qwen3.5, GLM-4V, Ernie 4.5 VL, Kimi K2.5, PaddleOCR-VL, MiniMax-M3-VL, Inkling 2 and their kin).

Their attentions call a module-level ``apply_rotary_pos_emb_vision(q, k, cos, sin)``: q and k
of ``[S, H, D]`` (views of one packed qkv projection) or ``[B, S, H, D]``, cos and sin
``[S, D]`` (fp32 from the tower's rotary embedding), and the rotation computed in fp32 before
q and k are cast back to their dtype: two casts up, two concatenations, six products and sums
and two casts down in eager, over every patch of every image. kiln.rope computes the same in one
launch (fp32 math, one rounding to q's dtype), reading the fp32 table as it is.

Two variants, told apart by probes: Inkling 2's rotates interleaved pairs (``rotate_pairwise``);
MiniMax-M3-VL's rotates only the first ``cos.shape[-1]`` columns of each head (its 3-D RoPE),
passing the rest through, in q's dtype.
"""

from typing import Callable, NamedTuple, Optional, Tuple

import torch

from .. import rope_ops
from .forwards import kiln_can_take
from .rotation_probes import disagreement

VISION_GLOBAL = "apply_rotary_pos_emb_vision"


class VisionForm(NamedTuple):
    """How a tower's ``apply_rotary_pos_emb_vision`` rotates: pairs (interleaved, else
    rotate_half's halves); whether a table narrower than the head rotates only its first
    columns (partial); whether an fp32 table with q of another dtype gives q's dtype, rotated
    in fp32 (the Qwen towers' casts), or only tables of q's own dtype are taken (MiniMax-M3-VL's
    rotation promotes such a call's output to fp32); and the ranks of q it computes for (an
    earlier MiniMax-M3-VL broadcast its table for [B, S, H, D] q only)."""
    interleaved: bool = False
    partial: bool = False
    fp32_table: bool = True
    ranks: Tuple[int, ...] = (3, 4)


def _rotary_dim(q, k, cos, sin, form: VisionForm) -> Optional[int]:
    """The columns kiln.rope rotates for ``apply_rotary_pos_emb_vision(q, k, cos, sin)``, or None
    where it does not compute it: q and k of ``[S, H, D]`` or ``[B, S, H, D]`` (of the form's
    ranks; D even, one S), cos and sin ``[S, R]`` in q's dtype (or fp32, where the form allows)
    on q's device, R = D (or, partial, any even R up to D)."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin)) or q.dim() not in form.ranks \
            or k.dim() != q.dim() or cos.dim() != 2 or cos.shape != sin.shape:
        return None
    d, r = q.shape[-1], cos.shape[-1]
    if d % 2 or k.shape[-1] != d or q.shape[-3] != cos.shape[0] or k.shape[-3] != cos.shape[0] \
            or (q.dim() == 4 and k.shape[0] != q.shape[0]):
        return None
    if not (r == d or (form.partial and 0 < r < d and r % 2 == 0)):
        return None
    table_dtypes = (torch.float32, q.dtype) if form.fp32_table else (q.dtype,)
    if cos.dtype not in table_dtypes or sin.dtype != cos.dtype or cos.device != q.device \
            or sin.device != q.device:
        return None
    return r if kiln_can_take(q, k, differentiable=True) else None


def vision_rope(original: Callable, form: VisionForm = VisionForm()) -> Callable:
    """``apply_rotary_pos_emb_vision`` as one kiln.rope launch of the ``form`` where
    :func:`_rotary_dim` allows, the ``original`` function otherwise (other signatures
    included)."""

    whole = {"layout": "bshd", **({"interleaved": True} if form.interleaved else {})}

    def apply_rotary_pos_emb_vision(*args, **kwargs):
        rotary = None if len(args) != 4 or kwargs else _rotary_dim(*args, form)
        if rotary is None:
            return original(*args, **kwargs)
        q, k, cos, sin = args
        options = whole if rotary == q.shape[-1] else {**whole, "rotary_dim": rotary}
        if q.dim() == 4:
            return rope_ops.rope(q, k, cos, sin, **options)
        q_out, k_out = rope_ops.rope(q.unsqueeze(0), k.unsqueeze(0), cos, sin, **options)
        return q_out.squeeze(0), k_out.squeeze(0)

    apply_rotary_pos_emb_vision.__wrapped__ = original
    return apply_rotary_pos_emb_vision


def _probes(generator: torch.Generator, dtype: torch.dtype, table_dtype: torch.dtype, rotated: int = 8):
    """(q, k, cos, sin) as the towers make them: q and k [S, H, 8] views of one packed qkv
    projection, and the same as [B, S, H, 8]; a table [S, rotated] of distinct angles
    (rotate_half's tables repeat each for both halves, interleaved ones for both of a pair:
    either way, a rotation of the other kind disagrees on these)."""
    qkv = torch.randn(5, 3, 4, 8, generator=generator).to(dtype).permute(1, 0, 2, 3)
    angles = torch.rand(5, rotated, generator=generator) * 20.0
    cos, sin = angles.cos().to(table_dtype), angles.sin().to(table_dtype)
    batched = torch.randn(2, 5, 4, 8, generator=generator).to(dtype), torch.randn(2, 5, 4, 8, generator=generator).to(dtype)
    return [(qkv[0], qkv[1], cos, sin), (*batched, cos, sin)]


def _agreement(function: Callable, form: VisionForm, tables: str = "q's", rotated: int = 8) \
        -> Optional[Tuple[bool, str]]:
    """:func:`.rotation_probes.disagreement` of ``function`` and kiln's ``form`` on probes whose
    table is ``rotated`` wide: q and k in fp32 and bf16, of the form's ranks (three and four
    dimensions), the table in q's dtype (``tables`` "q's") or, q in bf16, in fp32 ("fp32")."""
    generator = torch.Generator().manual_seed(0)
    dtypes = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)] if tables == "q's" \
        else [(torch.bfloat16, torch.float32)]
    probes = ((f"{args[0].dim()}-D ", args) for dtype, table_dtype in dtypes
              for args in _probes(generator, dtype, table_dtype, rotated) if args[0].dim() in form.ranks)
    return disagreement(function, vision_rope(function, form), probes, VISION_GLOBAL)


def compare(function: Callable) -> Tuple[Optional[VisionForm], str]:
    """(the form in which kiln.rope computes what ``function`` computes on the towers' probes,
    and what it is), or (None, why none does). Tables as wide as the head and of q's dtype decide
    the pairs (rotate_half's first) and the ranks of q taken (three and four dimensions, or the
    one the function computes alone); then kiln's form takes fp32 tables with bf16 q, and tables
    half the head's width, only where ``function`` gives the same on those too (else such calls
    are left to it)."""
    reasons = []
    for interleaved in (False, True):
        found = _agreement(function, VisionForm(interleaved))
        if found is None:
            ranks = (3, 4)
            break
        ranks = tuple(r for r in (3, 4) if _agreement(function, VisionForm(interleaved, ranks=(r,))) is None)
        if ranks:
            break
        reasons.append(found[1])
    else:
        return None, f"it is neither rotate_half nor interleaved RoPE: {reasons[0]}"
    fp32_table = _agreement(function, VisionForm(interleaved, ranks=ranks), "fp32") is None
    partial = _agreement(function, VisionForm(interleaved, True, fp32_table, ranks), rotated=4) is None
    form = VisionForm(interleaved, partial, fp32_table, ranks)
    text = ("interleaved pairs" if interleaved else "rotate_half") \
        + (", an fp32 table or one of q's dtype" if fp32_table else ", a table of q's dtype") \
        + (", the first cos.shape[-1] columns of each head" if partial else "") \
        + ("" if ranks == (3, 4) else f", q of {ranks[0]} dimensions only")
    return form, text
