"""Mochi's patterns (:mod:`.mochi`), each confirmed on a probe as :mod:`.detect_dit`'s are: its
attention (found by its processor's ``__call__``) and its block (found by its children and its
forward's arguments)."""

from typing import Callable, Union

import torch

from . import mochi
from .detect import NoMatch, _Swapped
from .detect_dit import (_PROBE_DIM, DitMatch, _compare_calls, _confirmed, _linear, _LocalAttention, _norm_weights,
                         _ProbeFF, _processor_call, _Stack)
from .detect_flux2 import _takes

_BLOCK_ARGUMENTS = ("hidden_states", "encoder_hidden_states", "temb", "encoder_attention_mask", "image_rotary_emb")
_BLOCK_CHILDREN = ("norm1", "norm1_context", "attn1", "norm2", "norm3", "norm4", "ff")


def attention_candidate(module: torch.nn.Module) -> bool:
    return _processor_call(module) == "MochiAttnProcessor2_0.__call__"


def block_candidate(module: torch.nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Module) for n in _BLOCK_CHILDREN) \
        and isinstance(getattr(module, "context_pre_only", None), bool) and _takes(module, _BLOCK_ARGUMENTS)


def _attention_calls(module: torch.nn.Module, heads: int, head_dim: int, g: torch.Generator):
    """Probe calls: 6 video and 4 text tokens, the text's valid tokens first (one entry padded)
    and not first, a rotation table of its own per token and head."""
    x = torch.randn(2, 6, _PROBE_DIM, generator=g)
    enc = torch.randn(2, 4, _PROBE_DIM, generator=g)
    angles = 40 * torch.randn(6, heads, head_dim // 2, generator=g)
    rope = (angles.cos(), angles.sin())
    masks = (torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]), torch.tensor([[1, 0, 1, 1], [0, 1, 1, 0]]))
    return [((module, x), dict(encoder_hidden_states=enc, attention_mask=mask, image_rotary_emb=rope))
            for mask in masks]


def classify_attention(module: torch.nn.Module, processor) -> Union[DitMatch, NoMatch]:
    heads, inner = getattr(module, "heads", None), getattr(module, "inner_dim", None)
    if not isinstance(heads, int) or not isinstance(inner, int) or heads <= 0 or inner % heads or (inner // heads) % 2:
        return NoMatch("attention", f"its heads ({heads!r}) do not split its width {inner!r} into even head dims")
    g = torch.Generator().manual_seed(0)
    children = {n: _linear(_PROBE_DIM, inner, g)
                for n in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj")}
    if isinstance(getattr(module, "to_add_out", None), torch.nn.Module):
        children["to_add_out"] = _linear(inner, _PROBE_DIM, g)
    swaps = [_Swapped(module, children=children),
             _Swapped(module.to_out, children={"0": _linear(inner, _PROBE_DIM, g)})]
    swaps += _norm_weights(module, ("norm_q", "norm_k", "norm_added_q", "norm_added_k"), g)
    calls = _attention_calls(module, heads, inner // heads, g)
    with torch.no_grad(), _LocalAttention(processor), _Stack(swaps):
        why = _compare_calls(processor, mochi.MochiAttnProcessor(processor), calls)
    if why is not None:
        return NoMatch("attention", f"does not compute Mochi's attention as kiln's processor does: {why}")
    return DitMatch("mochi attention (rope of q and k by per-head tables, valid tokens once a forward)", "rope",
                    "rope", mochi.MochiAttnProcessor, target="processor")


class _ProbeAttention(torch.nn.Module):
    """A stand-in for Mochi's attention: elementwise in each stream, every argument changing the
    output."""

    def __init__(self, d: int, dc: int, g: torch.Generator):
        super().__init__()
        self.w, self.b, self.c = torch.randn(d, generator=g), torch.randn(d, generator=g), torch.randn(dc, generator=g)

    def forward(self, hidden_states, encoder_hidden_states, attention_mask=None, image_rotary_emb=None):
        y = torch.tanh(hidden_states * self.w + self.b) + encoder_hidden_states.mean((1, 2))[:, None, None]
        if image_rotary_emb is not None:
            y = y + image_rotary_emb[0].mean()
        if attention_mask is not None:
            y = y + attention_mask.float().mean()
        return y, torch.tanh(encoder_hidden_states * self.c)


def classify_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    pre_only = module.context_pre_only
    context = module.norm1_context
    if not isinstance(getattr(module.norm1, "linear", None), torch.nn.Linear) \
            or not isinstance(getattr(context, "linear_1" if pre_only else "linear", None), torch.nn.Linear):
        return NoMatch("block", "its norm1 (or norm1_context) has no modulation linear where Mochi's has one")
    d, dc = 8, 4
    g = torch.Generator().manual_seed(0)
    swaps = [_Swapped(module, children={"attn1": _ProbeAttention(d, dc, g), "ff": _ProbeFF(d, g)}
                      | ({} if pre_only else {"ff_context": _ProbeFF(dc, g)})),
             _Swapped(module.norm1, children={"linear": _linear(d, 4 * d, g)})]
    if pre_only:
        swaps.append(_Swapped(context, children={"linear_1": _linear(d, dc, g)}))
    else:
        swaps.append(_Swapped(context, children={"linear": _linear(d, 4 * dc, g)}))
    h = torch.randn(2, 5, d, generator=g) + 0.5
    c = torch.randn(2, 3, dc, generator=g) - 0.5
    temb, mask = torch.randn(2, d, generator=g), torch.tensor([[1, 1, 1], [1, 1, 0]])
    rope = (torch.randn(5, 2, 2, generator=g), torch.randn(5, 2, 2, generator=g))
    calls = [((h, c, temb, mask, rope), {}), ((h, c, temb, mask), {"image_rotary_emb": rope}),
             ((), dict(hidden_states=h, encoder_hidden_states=c, temb=temb, encoder_attention_mask=mask))]
    match = DitMatch("mochi block (modulated rms_norm seams)", mochi.BLOCK_OPS, "adaln", mochi.mochi_block)
    return _confirmed(match, original, mochi.mochi_block(module, original), calls, swaps,
                      "Mochi's block seams")


CANDIDATES = (
    (attention_candidate, classify_attention),
    (block_candidate, classify_block),
)
