"""Qwen-Image 2.1's blocks (diffusers' ``QwenImage21TransformerBlock``: one stream of text,
condition images and the target image) with the seams between their matmuls fused.

Every block reads one modulation the model computes once a forward (``[B', 4D]``: the
attention's scale and gate, the MLP's), scale only (no shift) and gated through ``tanh``. With
``causal_condition`` the model conditions the text and condition-image tokens on ``t = 0``: its
modulation has one more row, and each block selects, per token, the target image's sample row or
that last row (``torch.where`` over ``[B, T, D]``, four times a block) and takes the gates'
``tanh`` (twice more over ``[B, T, D]``). kiln derives the scales and the activated gates once a
forward for all the blocks (per sample ``[B, 1, D]``, or per token as diffusers selects them), and
in each block:

* norm1's LayerNorm and ``x * (1 + scale)`` -> one ``kiln.adaln`` (a shift of zeros, broadcast);
* ``h + tanh(gate) * attn`` then norm2 and its modulation -> one ``kiln.gated_adaln``;
* ``h + tanh(gate) * mlp`` -> one ``kiln.gated_residual_`` into that new h.

Each seam is rounded once to h's dtype where diffusers rounds after each product and sum. The
attention (with its KV cache and segments) and the feed-forward are the block's own modules
(patched where kiln.patch patched them). Anything else (autograd, hooks on the norms, a norm
kiln does not compute) runs diffusers' forward, and so does torch.compile's tracing, where
Inductor fuses the seams with their neighbours itself.
"""

from typing import Callable, Optional

import torch

from .. import activation_ops, norm_ops
from .forwards import any_hooks, kiln_can_take, norm_eps, records_parameters
from .per_forward import OncePerForward

BLOCK_OPS = "adaln + gated_adaln + gated_residual"
NORMS = ("img_norm1", "img_norm2")


def _selected(rows: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """diffusers' ``_select_modulation_rows``: [B, 1, D] rows, or per token [B, T, D] with the
    last of B + 1 rows where ``mask`` is False."""
    if mask is None:
        return rows.unsqueeze(1)
    return torch.where(mask.view(1, -1, 1), rows[:-1].unsqueeze(1), rows[-1:].unsqueeze(0))


def _derive(modulation: torch.Tensor, mask: Optional[torch.Tensor] = None) -> tuple:
    """(scale1, tanh(gate1), scale2, tanh(gate2), zero shift) of a block, from the model's
    modulation, each as the block selects it."""
    scale1, gate1, scale2, gate2 = (_selected(t, mask) for mod in modulation.chunk(2, dim=-1)
                                    for t in mod.chunk(2, dim=-1))
    zero = scale1.new_zeros(1, 1, scale1.shape[-1]).expand(scale1.shape)
    return scale1, gate1.tanh(), scale2, gate2.tanh(), zero


_DERIVED = OncePerForward(_derive)


def _fits(module: torch.nn.Module, h, modulation, mask) -> bool:
    if torch.compiler.is_compiling():
        return False
    if not isinstance(h, torch.Tensor) or not isinstance(modulation, torch.Tensor) or h.dim() != 3 \
            or modulation.dim() != 2 or modulation.shape[-1] != 4 * h.shape[-1] or not kiln_can_take(h, modulation):
        return False
    rows = h.shape[0] + (0 if mask is None else 1)
    if modulation.shape[0] != rows or (mask is not None and (not isinstance(mask, torch.Tensor)
                                                            or mask.dtype != torch.bool or mask.shape != h.shape[1:2])):
        return False
    for name in NORMS:
        norm = getattr(module, name)
        if type(norm) is not torch.nn.LayerNorm or tuple(norm.normalized_shape) != (h.shape[-1],) \
                or norm.weight is not None or norm.bias is not None or any_hooks(norm):
            return False
    return not records_parameters(module)


def qwen_image21_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``QwenImage21TransformerBlock.forward`` with its seams fused (see the module's docstring)."""

    def forward(hidden_states, modulation, rotary_emb=None, attention_mask=None, target_token_mask=None,
                layer_cache=None, kv_cache_mode=None, cache_write_slice=None, segments=None, key_valid=None):
        h, mask = hidden_states, target_token_mask
        if not _fits(module, h, modulation, mask):
            return original(hidden_states, modulation, rotary_emb, attention_mask, target_token_mask, layer_cache,
                            kv_cache_mode, cache_write_slice, segments, key_valid)
        scale1, gate1, scale2, gate2, zero = _DERIVED.get(modulation) if mask is None else \
            _DERIVED.get(modulation, mask)
        x = norm_ops.adaln(h, scale1, zero, None, norm_eps(module.img_norm1, h), "layer")
        attn = module.attn(hidden_states=x, attention_mask=attention_mask, rotary_emb=rotary_emb,
                           layer_cache=layer_cache, kv_cache_mode=kv_cache_mode, cache_write_slice=cache_write_slice,
                           segments=segments, key_valid=key_valid)
        if attn.shape != h.shape or not kiln_can_take(h, attn):
            h = h + gate1 * attn
            x = module.img_norm2(h) * (1 + scale2)
        else:
            h, x = norm_ops.gated_adaln(h, attn, gate1, scale2, zero, None, norm_eps(module.img_norm2, h), "layer")
        mlp = module.img_mlp(x)
        if mlp.shape != h.shape or not kiln_can_take(h, mlp):
            h = h + gate2 * mlp
        else:
            h = activation_ops.gated_residual_(h, mlp, gate2)
        if h.dtype == torch.float16:
            h = h.clip(-65504, 65504)
        return h

    return forward
