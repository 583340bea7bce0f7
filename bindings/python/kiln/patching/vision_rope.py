"""The vision towers' RoPE of transformers' multimodal models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
Qwen3.5, GLM-4V, Ernie 4.5 VL, Kimi K2.5, PaddleOCR-VL and their kin).

Their attentions call a module-level ``apply_rotary_pos_emb_vision(q, k, cos, sin)``: q and k
of ``[S, H, D]`` (views of one packed qkv projection) or ``[B, S, H, D]``, cos and sin
``[S, D]`` (fp32 from the tower's rotary embedding), and the rotation computed in fp32 before
q and k are cast back to their dtype: two casts up, two concatenations, six products and sums
and two casts down in eager, over every patch of every image. kiln.rope computes the same in one
launch (fp32 math, one rounding to q's dtype), reading the fp32 table as it is.
"""

from typing import Callable, Optional

import torch

from .. import rope_ops
from .forwards import kiln_can_take
from .rotation_probes import disagreement

VISION_GLOBAL = "apply_rotary_pos_emb_vision"


def _fits(q, k, cos, sin) -> bool:
    """Whether kiln.rope computes ``apply_rotary_pos_emb_vision(q, k, cos, sin)``: q and k of
    ``[S, H, D]`` or ``[B, S, H, D]`` (D even, one S), cos and sin ``[S, D]`` in fp32 or q's
    dtype on q's device."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin)) or q.dim() not in (3, 4) \
            or k.dim() != q.dim() or cos.dim() != 2 or cos.shape != sin.shape:
        return False
    d = q.shape[-1]
    if d % 2 or k.shape[-1] != d or cos.shape[-1] != d or q.shape[-3] != cos.shape[0] \
            or k.shape[-3] != cos.shape[0] or (q.dim() == 4 and k.shape[0] != q.shape[0]):
        return False
    if cos.dtype not in (torch.float32, q.dtype) or sin.dtype != cos.dtype \
            or cos.device != q.device or sin.device != q.device:
        return False
    return kiln_can_take(q, k, differentiable=True)


def vision_rope(original: Callable) -> Callable:
    """``apply_rotary_pos_emb_vision`` as one kiln.rope launch where :func:`_fits` allows, the
    ``original`` function otherwise (other signatures included)."""

    def apply_rotary_pos_emb_vision(*args, **kwargs):
        if len(args) != 4 or kwargs or not _fits(*args):
            return original(*args, **kwargs)
        q, k, cos, sin = args
        if q.dim() == 4:
            return rope_ops.rope(q, k, cos, sin, layout="bshd")
        q_out, k_out = rope_ops.rope(q.unsqueeze(0), k.unsqueeze(0), cos, sin, layout="bshd")
        return q_out.squeeze(0), k_out.squeeze(0)

    apply_rotary_pos_emb_vision.__wrapped__ = original
    return apply_rotary_pos_emb_vision


def _probes(dtype: torch.dtype, generator: torch.Generator):
    """(q, k, cos, sin) as the towers make them: q and k [S, H, D] views of one packed qkv
    projection, and the same as [B, S, H, D]; an fp32 table [S, D], each angle for both
    halves."""
    qkv = torch.randn(5, 3, 4, 8, generator=generator).to(dtype).permute(1, 0, 2, 3)
    angles = torch.rand(5, 4, generator=generator) * 20.0
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    batched = torch.randn(2, 5, 4, 8, generator=generator).to(dtype), torch.randn(2, 5, 4, 8, generator=generator).to(dtype)
    return [(qkv[0], qkv[1], cos, sin), (*batched, cos, sin)]


def compare(function: Callable) -> Optional[str]:
    """None when ``function`` computes what kiln.rope computes on the towers' probes (q and k
    in fp32 and bf16, three and four dimensions); else why not."""
    generator = torch.Generator().manual_seed(0)
    probes = ((f"{args[0].dim()}-D ", args) for dtype in (torch.float32, torch.bfloat16)
              for args in _probes(dtype, generator))
    found = disagreement(function, vision_rope(function), probes, VISION_GLOBAL)
    return None if found is None else found[1]
