"""Stable Diffusion 3's and 3.5's transformer block (diffusers' ``JointTransformerBlock``) with
FLUX's seams fused.

The block is FLUX's double-stream block (:mod:`.flux_block`) under other arguments: each stream's
``h + gate_msa * attn`` then ``norm2(h) * (1 + scale_mlp) + shift_mlp`` -> one
``kiln.gated_adaln``, and ``h + gate_mlp * ff`` -> one ``kiln.gated_residual_``. SD3.5 Medium's
blocks with a second, image-only attention (``use_dual_attention``) add its gated output first:
``h + gate_msa * attn`` -> one ``kiln.gated_residual``, then the seam above with ``attn2``. The
last block's text stream ends at its norm (``context_pre_only``): it returns no text. The
attentions, norm1 and the feed-forwards are the block's own (patched where kiln.patch patched
them). Anything else (autograd, a chunked feed-forward, norm2 with parameters or hooks, IP-adapter
inputs) runs diffusers' forward.
"""

from typing import Callable

import torch

from .. import activation_ops
from .flux_block import plain_layer_norm, double_stream
from .forwards import kiln_can_take, records_parameters

BLOCK_OPS = "gated_adaln + gated_residual"


def _fits(module: torch.nn.Module, h, c, temb, joint_attention_kwargs) -> bool:
    if not (isinstance(h, torch.Tensor) and isinstance(c, torch.Tensor) and isinstance(temb, torch.Tensor)
            and h.dim() == 3 and c.dim() == 3 and kiln_can_take(h, c)):
        return False
    if getattr(module, "_chunk_size", None) is not None or (joint_attention_kwargs and any(
            k.startswith("ip_") for k in joint_attention_kwargs)):
        return False
    d = h.shape[-1]
    return plain_layer_norm(module.norm2, d) \
        and (module.context_pre_only or plain_layer_norm(module.norm2_context, d)) \
        and not records_parameters(module)


def _first_residual(h: torch.Tensor, attn: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``h + gate * attn`` (the dual block's first attention): one kiln call where it takes them."""
    if attn.shape == h.shape and kiln_can_take(h, attn, gate):
        return activation_ops.gated_residual(h, attn, gate[:, None])
    return h + gate.unsqueeze(1) * attn


def joint_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``JointTransformerBlock.forward`` with its seams fused (see the module's docstring)."""

    def forward(hidden_states, encoder_hidden_states, temb, joint_attention_kwargs=None):
        h, c = hidden_states, encoder_hidden_states
        if not _fits(module, h, c, temb, joint_attention_kwargs):
            return original(hidden_states, encoder_hidden_states, temb, joint_attention_kwargs)
        kwargs = joint_attention_kwargs or {}
        if module.use_dual_attention:
            norm_h, gate_msa, shift_mlp, scale_mlp, gate_mlp, norm_h2, gate_msa2 = module.norm1(h, emb=temb)
        else:
            norm_h, gate_msa, shift_mlp, scale_mlp, gate_mlp = module.norm1(h, emb=temb)
        if module.context_pre_only:
            norm_c = module.norm1_context(c, temb)
        else:
            norm_c, *text = module.norm1_context(c, emb=temb)
        attn, c_attn = module.attn(hidden_states=norm_h, encoder_hidden_states=norm_c, **kwargs)
        if module.use_dual_attention:
            h = _first_residual(h, attn, gate_msa)
            attn, gate_msa = module.attn2(hidden_states=norm_h2, **kwargs), gate_msa2
        new_h = double_stream(module.norm2, module.ff, h, attn, gate_msa, shift_mlp, scale_mlp, gate_mlp)
        if module.context_pre_only:
            return None, new_h
        return double_stream(module.norm2_context, module.ff_context, c, c_attn, *text), new_h

    return forward
