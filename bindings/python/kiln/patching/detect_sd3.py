"""Stable Diffusion 3's and 3.5's joint block (:mod:`.sd3_block`), found by its children and its
forward's arguments (FLUX's double-block classifier leaves it: its arguments differ) and
confirmed on a probe as :mod:`.detect_dit`'s patterns are."""

from typing import Callable, Union

import torch

from . import sd3_block
from .detect import NoMatch, _Swapped
from .detect_dit import DitMatch, _confirmed, _FluxProbeAttention, _ProbeAdaLN, _ProbeFF, double_block_width
from .detect_flux2 import _takes

_ARGUMENTS = ("hidden_states", "encoder_hidden_states", "temb", "joint_attention_kwargs")


def block_candidate(module: torch.nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Module)
               for n in ("norm1", "norm1_context", "attn", "norm2", "ff")) \
        and isinstance(getattr(module, "use_dual_attention", None), bool) \
        and isinstance(getattr(module, "context_pre_only", None), bool) and _takes(module, _ARGUMENTS)


class _ProbeDualAdaLN(_ProbeAdaLN):
    """A stand-in for SD3.5's SD35AdaLayerNormZeroX: x transformed twice, five [B, D] chunks."""

    def __init__(self, dim: int, g: torch.Generator):
        super().__init__(dim, 5, g)
        self.w2 = torch.randn(dim, generator=g)

    def forward(self, x, emb=None):
        norm, gate, shift, scale, gate_mlp, gate2 = super().forward(x, emb)
        return norm, gate, shift, scale, gate_mlp, torch.tanh(x * self.w2), gate2


class _ProbeContinuous(torch.nn.Module):
    """A stand-in for the last block's AdaLayerNormContinuous text norm, called (x, temb)."""

    def __init__(self, dim: int, g: torch.Generator):
        super().__init__()
        self.w, self.v = torch.randn(dim, generator=g), torch.randn(dim, generator=g)

    def forward(self, x, emb):
        return torch.tanh(x * self.w + (emb * self.v)[:, None])


def classify_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    d = double_block_width(module, "SD3")
    if isinstance(d, NoMatch):
        return d
    g = torch.Generator().manual_seed(0)
    dual, pre_only = module.use_dual_attention, module.context_pre_only
    if dual and not isinstance(getattr(module, "attn2", None), torch.nn.Module):
        return NoMatch("block", "it uses dual attention but has no attn2")
    children = {"norm1": _ProbeDualAdaLN(d, g) if dual else _ProbeAdaLN(d, 4, g),
                "norm1_context": _ProbeContinuous(d, g) if pre_only else _ProbeAdaLN(d, 4, g),
                "attn": _FluxProbeAttention(d, g, joint=True), "ff": _ProbeFF(d, g)}
    if dual:
        children["attn2"] = _FluxProbeAttention(d, g, joint=False)
    if not pre_only:
        children["ff_context"] = _ProbeFF(d, g)
    h, c = torch.randn(2, 5, d, generator=g) + 0.5, torch.randn(2, 3, d, generator=g) - 0.5
    temb = torch.randn(2, d, generator=g)
    calls = [((h, c, temb), {}), ((), dict(hidden_states=h, encoder_hidden_states=c, temb=temb,
                                            joint_attention_kwargs={}))]
    match = DitMatch("sd3 joint block (gated residual + norm seams)", sd3_block.BLOCK_OPS, "adaln",
                     sd3_block.joint_block)
    return _confirmed(match, original, sd3_block.joint_block(module, original), calls,
                      [_Swapped(module, children=children)], "SD3's joint block seams")


CANDIDATES = ((block_candidate, classify_block),)
