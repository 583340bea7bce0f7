"""Stable Audio 3's DiT block (:mod:`.stable_audio3`), confirmed on a probe as :mod:`.detect_dit`'s
blocks are: its attentions and feed-forward swapped for elementwise stand-ins, its norms' gammas
for random values, then the replacement's output compared with the original's."""

import inspect
from typing import Callable, Union

import torch

from . import forwards, stable_audio3
from .detect import NoMatch, _Swapped, has_child
from .detect_dit import DitMatch, _confirmed, _ProbeFF, _rms_norm_child

_BLOCK_CHILDREN = ("self_attn", "cross_attn", "ff") + stable_audio3.NORMS
_BLOCK_ARGUMENTS = ("hidden_states", "context", "global_modulation", "rope", "context_mask", "local_seq",
                    "num_memory_tokens")


def block_candidate(module: torch.nn.Module) -> bool:
    return all(has_child(module, n) for n in _BLOCK_CHILDREN) \
        and isinstance(getattr(module, "to_scale_shift_gate", None), torch.nn.Parameter)


class _ProbeSelfAttention(torch.nn.Module):
    """A stand-in for the self-attention: elementwise, the rotation changes its output."""

    def __init__(self, dim: int, g: torch.Generator):
        super().__init__()
        self.w, self.b = torch.randn(dim, generator=g), torch.randn(dim, generator=g)

    def forward(self, hidden_states, rope):
        return torch.tanh(hidden_states * self.w + self.b) + rope.mean() * self.w


class _ProbeCrossAttention(torch.nn.Module):
    """A stand-in for the cross-attention: elementwise, the context and its mask change its output."""

    def __init__(self, dim: int, g: torch.Generator):
        super().__init__()
        self.w, self.b = torch.randn(dim, generator=g), torch.randn(dim, generator=g)

    def forward(self, hidden_states, context, context_mask=None):
        y = torch.tanh(hidden_states * self.w - self.b) + context.mean(1, keepdim=True)
        if context_mask is not None:
            y = y + context_mask.float().mean() * self.b
        return y


def classify_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    for name in stable_audio3.NORMS:  # the seams read each norm's gamma
        result = _rms_norm_child(module, name)
        if isinstance(result, NoMatch):
            return NoMatch("block", result.reason)
        if result.factory is not forwards.rms_norm_gamma:
            return NoMatch("block", f"{name} computes {result.kind}, not an RMSNorm scaled by a gamma")
    if tuple(inspect.signature(original).parameters) != _BLOCK_ARGUMENTS:
        return NoMatch("block", f"its forward does not take Stable Audio 3's block arguments {_BLOCK_ARGUMENTS}")
    table = module.to_scale_shift_gate
    if table.dim() != 1 or table.shape[0] % 6:
        return NoMatch("block", f"its to_scale_shift_gate is not six [D] chunks ({tuple(table.shape)})")
    d = table.shape[0] // 6
    g = torch.Generator().manual_seed(0)
    children = {"self_attn": _ProbeSelfAttention(d, g), "cross_attn": _ProbeCrossAttention(d, g),
                "ff": _ProbeFF(d, g)}
    swaps = [_Swapped(module, children=children, params={"to_scale_shift_gate": torch.randn(6 * d, generator=g)})]
    swaps += [_Swapped(getattr(module, name), params={"gamma": 1 + 0.3 * torch.randn(d, generator=g)})
              for name in stable_audio3.NORMS]
    h = torch.randn(2, 5, d, generator=g) + 0.5
    context = torch.randn(2, 3, d, generator=g)
    mask = torch.tensor([[True] * 3, [True, True, False]])
    rope = torch.randn(5, 4, generator=g)
    calls = [((h, context, torch.randn(2, 6 * d, generator=g), rope), dict(context_mask=mask)),
             ((h, context, torch.randn(2, 6 * d, generator=g), rope), dict(num_memory_tokens=2))]
    patched = stable_audio3.stable_audio3_block(module, original)
    match = DitMatch("stable-audio-3 block (adaln, gated residual + norm seams)", stable_audio3.BLOCK_OPS, "adaln",
                     stable_audio3.stable_audio3_block)
    return _confirmed(match, original, patched, calls, swaps, "Stable Audio 3's block seams")


CANDIDATES = ((block_candidate, classify_block),)
