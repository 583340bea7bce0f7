"""FLUX.3's attention (:mod:`.flux3`), found by its processor's ``__call__`` and confirmed on a
probe as :mod:`.detect_dit`'s attentions are."""

import functools
from typing import Union

import torch

from . import flux3
from .detect import NoMatch, _Swapped
from .detect_dit import _PROBE_DIM, DitMatch, _fused_or_plain, _linear, _processor_call


def attention_candidate(module: torch.nn.Module) -> bool:
    return _processor_call(module) == "Flux3AttnProcessor.__call__"


def classify_attention(module: torch.nn.Module, processor, fuse_norms: bool = True) -> Union[DitMatch, NoMatch]:
    """kiln's processor for a FLUX.3 attention: its fp32 per-head q/k norms and the rotation in
    one launch where the norms are RMSNorms kiln computes (and ``fuse_norms``), else the rotation."""
    head_dim, heads = getattr(module, "head_dim", None), getattr(module, "heads", None)
    if not isinstance(head_dim, int) or not isinstance(heads, int) or head_dim % 2:
        return NoMatch("attention", f"its head_dim {head_dim!r} is not even")
    inner = heads * head_dim
    g = torch.Generator().manual_seed(0)
    if getattr(module, "fused_projections", False):
        children = {"to_qkv": _linear(_PROBE_DIM, 3 * inner, g)}
    else:
        children = {name: _linear(_PROBE_DIM, inner, g) for name in ("to_q", "to_k", "to_v")}
    swaps = [_Swapped(module, children=children),
             _Swapped(module.to_out, children={"0": _linear(inner, _PROBE_DIM, g)})]
    x = torch.randn(2, 6, _PROBE_DIM, generator=g)
    angles = 40 * torch.randn(6, head_dim // 2, generator=g)
    rope = (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1))
    calls = [((module, x), dict(image_rotary_emb=rope)), ((module, x), {})]
    why, fused = _fused_or_plain(module, processor, flux3.Flux3AttnProcessor, calls, swaps, ("norm_q", "norm_k"), g,
                                 fuse_norms)
    if why is not None:
        return NoMatch("attention", f"does not compute FLUX.3's attention as kiln's processor does: {why}")
    if fused:
        return DitMatch("flux.3 attention (per-head q/k rms_norm + rope)", "head_norm_rope", "rope",
                        functools.partial(flux3.Flux3AttnProcessor, fuse_norms=True), target="processor")
    return DitMatch("flux.3 attention (rope)", "rope", "rope", flux3.Flux3AttnProcessor, target="processor")


CANDIDATES = ((attention_candidate, classify_attention),)
