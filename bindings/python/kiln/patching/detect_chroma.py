"""Chroma's patterns (:mod:`.chroma`): its pruned AdaLN modules (a norm and no projection; the
modulation rows come as ``emb``), and its double and single blocks, found by FLUX's children and
Chroma's forward arguments (FLUX's block classifiers leave them: their arguments differ), each
confirmed on a probe as :mod:`.detect_dit`'s patterns are."""

import inspect
from typing import Callable, Union

import torch

from . import chroma, detect, replace
from .detect import NoMatch, _Swapped
from .detect_dit import (DitMatch, _confirmed, _FluxProbeAttention, _modulated_norm_kind, _norm_weights,
                         _norm_width, _ProbeFF, _Stack, double_block_width, flux_double_block_candidate,
                         flux_single_block_candidate, single_block_match, single_block_probe)
from .detect_flux2 import _takes

_DOUBLE_ARGUMENTS = ("hidden_states", "encoder_hidden_states", "temb", "image_rotary_emb", "attention_mask",
                     "joint_attention_kwargs")
_SINGLE_ARGUMENTS = ("hidden_states", "temb", "image_rotary_emb", "attention_mask", "joint_attention_kwargs")


def pruned_adaln_candidate(module: torch.nn.Module) -> bool:
    norm = getattr(module, "norm", None)
    if not isinstance(norm, torch.nn.Module) or not detect.norm_candidate(norm) \
            or isinstance(getattr(module, "linear", None), torch.nn.Module):
        return False
    try:
        params = tuple(inspect.signature(replace.original_forward(module)).parameters)
    except (TypeError, ValueError):
        return False
    return len(params) >= 2 and params[0] == "x" and "emb" in params


def double_block_candidate(module: torch.nn.Module) -> bool:
    return flux_double_block_candidate(module) and _takes(module, _DOUBLE_ARGUMENTS)


def single_block_candidate(module: torch.nn.Module) -> bool:
    return flux_single_block_candidate(module) and _takes(module, _SINGLE_ARGUMENTS)


def classify_pruned_adaln(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    """The layout (6, 3 or 2 rows of emb) on which the module's forward runs and kiln's computes
    what it does."""
    kind, d = _modulated_norm_kind(module.norm), _norm_width(module.norm)
    if isinstance(kind, NoMatch):
        return kind
    if not d:
        return NoMatch("adaln", "its norm's width is unknown")
    if getattr(module, "emb", None) is not None:
        return NoMatch("adaln", "it embeds the timestep itself (its emb module)")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, d, generator=g) + 0.5
    swaps = _norm_weights(module, ("norm",), g)
    for chunks in chroma.PRUNED_LAYOUTS:
        calls = [((x,), {"emb": torch.randn(2, chunks, d, generator=g)})]
        with torch.no_grad(), _Stack(swaps):
            try:
                original(*calls[0][0], **calls[0][1])
            except Exception:
                continue  # the module chunks emb into another count of rows
        factory = chroma.pruned_adaln(chunks, kind)
        match = DitMatch(f"adaln ({kind} norm, pruned {chroma.PRUNED_NAMES[chunks]})", "adaln", "adaln", factory)
        return _confirmed(match, original, factory(module, original), calls, swaps,
                          f"norm(x) * (1 + scale) + shift with {chunks} rows of emb", what="adaln")
    return NoMatch("adaln", f"its forward runs on no emb of {tuple(chroma.PRUNED_LAYOUTS)} rows of width {d}")


class _ProbePrunedAdaLN(torch.nn.Module):
    """A stand-in for Chroma's pruned AdaLN modules: x transformed, and one [B, D] tensor from each
    of emb's rows after the first (a block's norm1 reads its rows out of the block's temb)."""

    def __init__(self, dim: int, returned: int, g: torch.Generator):
        super().__init__()
        self.w = torch.randn(dim, generator=g)
        self.v = torch.randn(returned + 2, dim, generator=g)

    def forward(self, x, emb=None):
        shift, scale = emb[:, 0] * self.v[0], emb[:, 1] * self.v[1]
        out = torch.tanh(x * self.w) * (1 + scale[:, None]) + shift[:, None]
        return (out,) + tuple(torch.tanh(emb[:, i] * self.v[i]) for i in range(2, len(self.v)))


class _ProbeAttention(_FluxProbeAttention):
    """_FluxProbeAttention called as Chroma's blocks call it, with the expanded attention mask."""

    def forward(self, hidden_states, encoder_hidden_states=None, image_rotary_emb=None, attention_mask=None):
        y = super().forward(hidden_states, encoder_hidden_states, image_rotary_emb)
        if attention_mask is None:
            return y
        bump = attention_mask.float().mean(dim=(1, 2, 3))[:, None, None] * self.b
        return (y[0] + bump, y[1] - bump) if self.joint else y + bump


def _mask(g: torch.Generator, tokens: int) -> torch.Tensor:
    return (torch.rand(2, tokens, generator=g) > 0.3).float()


def classify_double_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    d = double_block_width(module, "Chroma")
    if isinstance(d, NoMatch):
        return d
    g = torch.Generator().manual_seed(0)
    children = {"norm1": _ProbePrunedAdaLN(d, 4, g), "norm1_context": _ProbePrunedAdaLN(d, 4, g),
                "attn": _ProbeAttention(d, g, joint=True), "ff": _ProbeFF(d, g), "ff_context": _ProbeFF(d, g)}
    h, c = torch.randn(2, 5, d, generator=g) + 0.5, torch.randn(2, 3, d, generator=g) - 0.5
    temb, rope = torch.randn(2, 12, d, generator=g), 0.1 * torch.randn(d, generator=g)
    calls = [((h, c, temb, rope, None, None), {}),
             ((), dict(hidden_states=h, encoder_hidden_states=c, temb=temb, image_rotary_emb=rope,
                       attention_mask=_mask(g, 8)))]
    match = DitMatch("chroma double block (gated residual + norm seams)", chroma.BLOCK_OPS, "adaln",
                     chroma.chroma_double_block)
    return _confirmed(match, original, chroma.chroma_double_block(module, original), calls,
                      [_Swapped(module, children=children)], "Chroma's double-stream block seams")


def classify_single_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    probe = single_block_probe(module, _ProbePrunedAdaLN, lambda d, g: _ProbeAttention(d, g, joint=False))
    if isinstance(probe, NoMatch):
        return probe
    d, g, act, swap = probe
    x = torch.randn(2, 8, d, generator=g)
    temb, rope = torch.randn(2, 3, d, generator=g), 0.1 * torch.randn(d, generator=g)
    calls = [((x, temb, rope, None, None), {}),
             ((), dict(hidden_states=x, temb=temb, image_rotary_emb=rope, attention_mask=_mask(g, 8)))]
    return _confirmed(single_block_match("chroma", act, chroma.chroma_single_block), original,
                      chroma.chroma_single_block(module, original), calls, [swap], "Chroma's single-stream block")


CANDIDATES = ((double_block_candidate, classify_double_block), (single_block_candidate, classify_single_block),
              (pruned_adaln_candidate, classify_pruned_adaln))
