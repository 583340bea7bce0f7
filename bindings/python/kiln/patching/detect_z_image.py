"""Z-Image's patterns (:mod:`.z_image`), each confirmed on a probe as :mod:`.detect_dit`'s are: its
attention (found by its processor's ``__call__``), its feed-forward (three projections and a
gating method) and its modulated transformer block."""

import inspect
from typing import Callable, Union

import torch

from . import z_image
from .detect import (_MLP_HIDDEN, _MLP_INNER, NoMatch, _Swapped, compare_with_probe_projections, has_child,
                     other_children)
from .detect_dit import (_PROBE_DIM, DitMatch, attention_match, _confirmed, _fused_or_plain, _linear, _norm_weights,
                         _ProbeFF, _processor_call, _rms_norm_children)

_BLOCK_CHILDREN = ("attention", "feed_forward") + z_image._NORMS
_BLOCK_ARGUMENTS = ("x", "attn_mask", "freqs_cis", "adaln_input", "noise_mask", "adaln_noisy", "adaln_clean")
_FF_PROJECTIONS = ("w1", "w2", "w3")


def attention_candidate(module: torch.nn.Module) -> bool:
    return _processor_call(module) == "ZSingleStreamAttnProcessor.__call__"


def feed_forward_candidate(module: torch.nn.Module) -> bool:
    return all(has_child(module, n) for n in _FF_PROJECTIONS) and callable(getattr(module, z_image.GATING, None))


def block_candidate(module: torch.nn.Module) -> bool:
    """A modulated block (the caption refiner's, with none, are norms, attention and feed-forward
    kiln.patch takes apart)."""
    return all(isinstance(getattr(module, n, None), torch.nn.Module) for n in _BLOCK_CHILDREN) \
        and getattr(module, "modulation", None) is True


def _freqs(batch: int, tokens: int, head_dim: int, g: torch.Generator) -> torch.Tensor:
    angles = 40 * torch.randn(batch, tokens, head_dim // 2, generator=g)
    return torch.polar(torch.ones_like(angles), angles)


def classify_attention(module: torch.nn.Module, processor, fuse_norms: bool = True) -> Union[DitMatch, NoMatch]:
    """kiln's processor for a Z-Image attention, with the per-head q/k norms in its launch where
    they are RMSNorms kiln computes (and ``fuse_norms``: kiln.patch's ops include ``rms_norm``)."""
    heads, inner = getattr(module, "heads", None), getattr(module, "inner_dim", None)
    if not isinstance(heads, int) or not isinstance(inner, int) or heads <= 0 or inner % heads or (inner // heads) % 2:
        return NoMatch("attention", f"its heads ({heads!r}) do not split its width {inner!r} into even head dims")
    g = torch.Generator().manual_seed(0)
    children = {name: _linear(_PROBE_DIM, inner, g) for name in ("to_q", "to_k", "to_v")}
    swaps = [_Swapped(module, children=children), _Swapped(module.to_out, children={"0": _linear(inner, _PROBE_DIM, g)})]
    x = torch.randn(2, 6, _PROBE_DIM, generator=g)
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    freqs = _freqs(2, 6, inner // heads, g)
    calls = [((module, x), dict(freqs_cis=freqs)), ((module, x), dict(attention_mask=mask, freqs_cis=freqs)),
             ((module, x), {})]
    why, fused = _fused_or_plain(module, processor, z_image.ZImageAttnProcessor, calls, swaps, ("norm_q", "norm_k"), g,
                                 fuse_norms)
    if why is not None:
        return NoMatch("attention", f"does not compute Z-Image's attention as kiln's processor does: {why}")
    return attention_match(fused, z_image.ZImageAttnProcessor, "z-image attention (per-head q/k rms_norm + rope)",
                           "z-image attention (rope of q and k)")


def classify_feed_forward(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    others = other_children(module, _FF_PROJECTIONS)
    if others:
        return NoMatch("mlp", others)
    hidden, inner = _MLP_HIDDEN, _MLP_INNER
    why = compare_with_probe_projections(module, original, z_image.feed_forward, z_image.GATING, (
        ("w1", hidden, inner), ("w3", hidden, inner), ("w2", inner, hidden)))
    if why is not None:
        return NoMatch("mlp", f"does not compute w2(silu(w1(x)) * w3(x)): {why}")
    return DitMatch("mlp swiglu (w1, w3, w2)", "swiglu", "swiglu", z_image.feed_forward)


class _ProbeAttention(torch.nn.Module):
    """A stand-in for the attention: elementwise, every argument changes its output."""

    def __init__(self, dim: int, g: torch.Generator):
        super().__init__()
        self.w, self.b = torch.randn(dim, generator=g), torch.randn(dim, generator=g)

    def forward(self, hidden_states, attention_mask=None, freqs_cis=None):
        y = torch.tanh(hidden_states * self.w + self.b)
        if attention_mask is not None:
            y = y + attention_mask.float().mean() * self.b
        if freqs_cis is not None:
            y = y + freqs_cis.real.mean() * self.w
        return y


def classify_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    why = _rms_norm_children(module, z_image._NORMS, "block")
    if why is not None:
        return why
    if tuple(inspect.signature(original).parameters) != _BLOCK_ARGUMENTS:
        return NoMatch("block", f"its forward does not take Z-Image's block arguments {_BLOCK_ARGUMENTS}")
    modulation = module.adaLN_modulation
    first = modulation[0] if isinstance(modulation, torch.nn.Sequential) and len(modulation) else None
    if not isinstance(first, torch.nn.Linear) or first.out_features % 4:
        return NoMatch("block", "its adaLN_modulation is not a linear map to four chunks")
    d, e = first.out_features // 4, first.in_features
    g = torch.Generator().manual_seed(0)
    children = {"attention": _ProbeAttention(d, g), "feed_forward": _ProbeFF(d, g),
                "adaLN_modulation": torch.nn.Sequential(_linear(e, 4 * d, g))}
    swaps = [_Swapped(module, children=children)] + _norm_weights(module, z_image._NORMS, g)
    x = torch.randn(2, 5, d, generator=g) + 0.5
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    freqs = _freqs(2, 5, 8, g)
    noise_mask = torch.tensor([[1, 1, 0, 0, 1], [0, 1, 1, 1, 1]])
    calls = [((x, mask, freqs, torch.randn(2, e, generator=g)), {}),
             ((x, None, freqs, torch.randn(2, e, generator=g)), {}),
             ((x, mask, freqs, None, noise_mask, torch.randn(2, e, generator=g), torch.randn(2, e, generator=g)), {})]
    patched = z_image.z_image_block(module, original)
    match = DitMatch("z-image block (adaln, gated residual + norm seams)", z_image.BLOCK_OPS, "adaln",
                     z_image.z_image_block)
    return _confirmed(match, original, patched, calls, swaps, "Z-Image's block seams")


CANDIDATES = (
    (attention_candidate, classify_attention),
    (feed_forward_candidate, classify_feed_forward),
    (block_candidate, classify_block),
)
