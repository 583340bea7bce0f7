"""CogVideoX's attention (:mod:`.cogvideox_attention`), found by its processor's ``__call__`` and
confirmed on a probe as :mod:`.detect_dit`'s patterns are. (Its blocks and AdaLN modules are
:mod:`.detect_dit`'s.)"""

from typing import Union

import torch

from . import cogvideox_attention
from .detect import NoMatch, _Swapped
from .detect_dit import (_PROBE_DIM, DitMatch, _compare_calls, _linear, _LocalAttention, _norm_weights,
                         _processor_call, _Stack)


def attention_candidate(module: torch.nn.Module) -> bool:
    return _processor_call(module) == "CogVideoXAttnProcessor2_0.__call__"


def classify_attention(module: torch.nn.Module, processor) -> Union[DitMatch, NoMatch]:
    heads, inner = getattr(module, "heads", None), getattr(module, "inner_dim", None)
    if not isinstance(heads, int) or not isinstance(inner, int) or heads <= 0 or inner % heads or (inner // heads) % 2:
        return NoMatch("attention", f"its heads ({heads!r}) do not split its width {inner!r} into even head dims")
    head_dim = inner // heads
    g = torch.Generator().manual_seed(0)
    swaps = [_Swapped(module, children={n: _linear(_PROBE_DIM, inner, g) for n in ("to_q", "to_k", "to_v")}),
             _Swapped(module.to_out, children={"0": _linear(inner, _PROBE_DIM, g)})]
    swaps += _norm_weights(module, ("norm_q", "norm_k"), g)
    x, enc = torch.randn(2, 6, _PROBE_DIM, generator=g), torch.randn(2, 3, _PROBE_DIM, generator=g)
    angles = 40 * torch.randn(6, head_dim // 2, generator=g)
    rope = (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1))
    calls = [((module, x, enc), dict(image_rotary_emb=rope)), ((module, x, enc), {})]
    with torch.no_grad(), _LocalAttention(processor), _Stack(swaps):
        why = _compare_calls(processor, cogvideox_attention.CogVideoXAttnProcessor(processor), calls)
    if why is not None:
        return NoMatch("attention", f"does not compute CogVideoX's attention as kiln's processor does: {why}")
    return DitMatch("cogvideox attention (rope of the video tokens' q and k in place)", "rope", "rope",
                    cogvideox_attention.CogVideoXAttnProcessor, target="processor")


CANDIDATES = ((attention_candidate, classify_attention),)
