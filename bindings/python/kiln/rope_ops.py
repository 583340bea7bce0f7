"""Python spellings of kiln's rotary position embedding ops.

Rotation styles: ``interleaved=False`` is transformers' ``rotate_half`` (Llama, Mistral,
Qwen, GPT-NeoX: pairs (i, i + R/2)); ``interleaved=True`` is diffusers' real form
(``apply_rotary_emb(..., use_real_unbind_dim=-1)``: LTX-Video, FLUX, GPT-J: pairs
(2j, 2j + 1)). Math in fp32, rounded once to q's dtype.

Layouts: ``"bhsd"`` takes q [B, Hq, S, D] and k [B, Hk, S, D] (transformers, after the
head split); ``"bshd"`` takes [B, S, H, D], or [B, S, H*D] before the head split (diffusers)
with the head dim ``head_dim`` (default: cos's last dimension, so a table spanning the
whole row, as LTX-Video's does, rotates the whole row). q and k may have different head
counts (grouped-query attention). cos/sin are fp32 or q's dtype, shaped [S, R],
[B or 1, S, R] or with a heads axis of 1 (transformers' ``unsqueeze(1)``); R is the
rotated width: the first ``rotary_dim`` (default R) columns of each head rotate, the rest
are copied. A table of ``rotary_dim / 2`` columns gives each rotation pair its angle once
(GPT-OSS's tables; half the table bytes): pair (i, i + R/2), or (2j, 2j + 1) interleaved,
turns by column i (j). ``deinterleave=True`` (with ``interleaved=False``) rotates each head's
first R columns de-interleaved: columns (2j, 2j + 1) turn as rotate_half turns (j, j + R/2), and
are written there. That is DeepSeek-V3's ``apply_rotary_pos_emb_interleave`` (its multi-head
latent attention with ``rope_interleave``, given the first half of its table), whose output is
rotate_half's layout.
"""

from typing import Optional, Sequence, Tuple

import torch

from ._direct import compiling as _compiling
from ._direct import direct as _direct

_rope = torch.ops.kiln.rope.default
_rope_inplace = torch.ops.kiln.rope_.default
_rope_3d = torch.ops.kiln.rope_3d.default
_rms_norm_rope = torch.ops.kiln.rms_norm_rope.default
_head_norm_rope = torch.ops.kiln.head_norm_rope.default
_head_norm_rope_inplace = torch.ops.kiln.head_norm_rope_.default

LTX_BASE_SIZES = (20, 2048, 2048)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         interleaved: bool = False, rotary_dim: int = -1, layout: str = "bhsd",
         head_dim: int = -1, deinterleave: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotates q and k in one launch; returns new (q, k) in q's dtype and shapes."""
    if _compiling():
        return _rope(q, k, cos, sin, interleaved, rotary_dim, layout, head_dim, deinterleave)
    return _direct.rope(q, k, cos, sin, interleaved, rotary_dim, layout, head_dim, deinterleave)


def rope_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
          interleaved: bool = False, rotary_dim: int = -1, layout: str = "bhsd",
          head_dim: int = -1, deinterleave: bool = False) -> None:
    """In-place ``rope``: q and k are overwritten (their unrotated columns untouched)."""
    if _compiling():
        _rope_inplace(q, k, cos, sin, interleaved, rotary_dim, layout, head_dim, deinterleave)
    else:
        _direct.rope_(q, k, cos, sin, interleaved, rotary_dim, layout, head_dim, deinterleave)


def head_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: Optional[torch.Tensor],
                   k_weight: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
                   eps: float = 1e-6, interleaved: bool = False, rotary_dim: int = -1,
                   layout: str = "bhsd", head_dim: int = -1) -> Tuple[torch.Tensor, torch.Tensor]:
    """The per-head q/k RMSNorm of Qwen3, Gemma 3 and FLUX, then ``rope``, in one launch: each
    head of q and of k (D elements) becomes ``x * rsqrt(mean(x^2) + eps) * weight`` (q's
    heads ``q_weight``, k's ``k_weight``, each [D] of q's dtype, or None for no weight),
    rounded to q's dtype as the separate norm's output is, and is then rotated as ``rope``
    rotates it (same arguments). Returns new (q, k) laid out as ``rope``'s. No backward."""
    if _compiling():
        return _head_norm_rope(q, k, q_weight, k_weight, cos, sin, eps, interleaved, rotary_dim,
                               layout, head_dim)
    return _direct.head_norm_rope(q, k, q_weight, k_weight, cos, sin, eps, interleaved,
                                  rotary_dim, layout, head_dim)


def head_norm_rope_(q: torch.Tensor, k: torch.Tensor, q_weight: Optional[torch.Tensor],
                    k_weight: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
                    eps: float = 1e-6, interleaved: bool = False, rotary_dim: int = -1,
                    layout: str = "bhsd", head_dim: int = -1) -> None:
    """In-place ``head_norm_rope``: q and k are overwritten (every column: the unrotated ones
    are normalised too)."""
    if _compiling():
        _head_norm_rope_inplace(q, k, q_weight, k_weight, cos, sin, eps, interleaved, rotary_dim,
                                layout, head_dim)
    else:
        _direct.head_norm_rope_(q, k, q_weight, k_weight, cos, sin, eps, interleaved, rotary_dim,
                                layout, head_dim)


def _video_args(rope_interpolation_scale, base_num_frames, base_height, base_width,
                patch_size_t, patch_size):
    scale = None if rope_interpolation_scale is None else [float(v) for v in rope_interpolation_scale]
    return scale, [base_num_frames, base_height, base_width], [patch_size_t, patch_size]


def rope_3d(q: torch.Tensor, k: torch.Tensor, num_frames: int, height: int, width: int,
            rope_interpolation_scale: Optional[Sequence[float]] = None, *,
            base_num_frames: int = 20, base_height: int = 2048, base_width: int = 2048,
            patch_size_t: int = 1, patch_size: int = 1,
            theta: float = 10000.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """LTX-Video's RoPE without its table: diffusers' ``LTXVideoRotaryPosEmbed(dim=C)``
    followed by ``apply_rotary_emb`` on q and k [B, S, C] (S = num_frames * height * width
    latent positions, frame-major), with the angles computed from each token's (frame, row,
    column) in the kernel. Arguments mirror diffusers' (rope_interpolation_scale as a
    3-sequence of floats, or None for raw coordinates)."""
    scale, base, patch = _video_args(rope_interpolation_scale, base_num_frames, base_height,
                                     base_width, patch_size_t, patch_size)
    return _rope_3d(q, k, [num_frames, height, width], scale, base, patch, theta)


def rms_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                  k_weight: torch.Tensor, eps: float = 1e-5,
                  cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None, *,
                  grid: Optional[Sequence[int]] = None,
                  rope_interpolation_scale: Optional[Sequence[float]] = None,
                  base_num_frames: int = 20, base_height: int = 2048, base_width: int = 2048,
                  patch_size_t: int = 1, patch_size: int = 1,
                  theta: float = 10000.0, head_dim: int = -1) -> Tuple[torch.Tensor, torch.Tensor]:
    """LTX-Video's and Wan's attention prologue in one kernel: ``norm_q(q)``, ``norm_k(k)``
    (RMSNorm across all heads, width C, with weights) then interleaved RoPE, for q and k
    [B, S, C]. Angles from ``cos``/``sin`` ([S, C] or [B or 1, S, C]: one a column, the
    rotation spanning the row, as LTX-Video's tables), or, with ``head_dim=D``, tables of
    D / 2 columns ([S, D/2], [B or 1, S, D/2] or [B or 1, S, 1, D/2]), one angle a rotation
    pair of each head of D columns, the same for every head: Wan's rotation of its [.., D]
    tables is this op given ``cos[..., 0::2]`` and ``sin[..., 1::2]``. Or, with
    ``grid=(num_frames, height, width)``, computed as ``rope_3d`` does. The normalised
    values are rounded to q's dtype before the rotation, as the separate norm's output is."""
    scale, base, patch = _video_args(rope_interpolation_scale, base_num_frames, base_height,
                                     base_width, patch_size_t, patch_size)
    return _rms_norm_rope(q, k, q_weight, k_weight, eps, cos, sin,
                          None if grid is None else list(grid), scale, base, patch, theta, head_dim)
