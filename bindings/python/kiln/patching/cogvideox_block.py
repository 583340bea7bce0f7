"""CogVideoX's transformer block (diffusers' ``CogVideoXBlock``) with the elementwise work
between its matmuls fused. diffusers runs each seam as separate 16-bit kernels over a stream's
whole hidden state; kiln, for the video stream and for the text stream:

* ``h + gate_msa * attn`` then norm2's ``norm(h) * (1 + scale) + shift`` -> one
  ``kiln.gated_adaln`` (norm2's LayerNorm weight read by the kernel, its bias folded into the
  shift: ``flux.folded_shift``);
* ``h + gate_ff * ff[:, stream]`` -> one ``kiln.gated_residual_`` into that new h.

Each seam is rounded once to h's dtype where diffusers rounds after each product and sum. The
norm1 module, the attention and the feed-forward (over both streams joined, text first) are the
block's own (patched where kiln.patch patched them); norm2's embedding is computed as its module
computes it. Anything else (autograd, hooks on norm2, a norm2 whose LayerNorm kiln does not
compute) runs diffusers' forward, and so does torch.compile's tracing: there Inductor fuses the
seams with their neighbours itself, and the fused block measured 2% slower compiled (with its
AdaLN modules still kiln's, the compiled block ties).
"""

from typing import Callable, Optional, Tuple

import torch

from .. import activation_ops, norm_ops
from .flux import folded_shift
from .forwards import any_hooks, kiln_can_take, norm_eps, records_parameters

BLOCK_OPS = "gated_adaln + gated_residual"


def _fits(module: torch.nn.Module, h, c, temb) -> bool:
    if torch.compiler.is_compiling():
        return False
    if not all(isinstance(t, torch.Tensor) for t in (h, c, temb)) or h.dim() != 3 or c.dim() != 3 \
            or temb.dim() != 2 or not kiln_can_take(h, c):
        return False
    norm = module.norm2.norm
    return type(norm) is torch.nn.LayerNorm and tuple(norm.normalized_shape) == (h.shape[-1],) \
        and not any_hooks(module.norm2) and not any_hooks(norm) and not records_parameters(module)


def _seam(norm: torch.nn.LayerNorm, h: torch.Tensor, attn: torch.Tensor, gate: torch.Tensor, scale: torch.Tensor,
          shift: torch.Tensor) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """``h + gate * attn`` and norm2's modulation of it as one kiln.gated_adaln: (new h, its
    modulated norm); None where kiln does not take the operands."""
    weight, bias = norm.weight, norm.bias
    operands = [t for t in (h, attn, gate, scale, shift, weight, bias) if t is not None]
    if attn.shape != h.shape or gate.shape != (h.shape[0], 1, h.shape[2]) or not kiln_can_take(*operands):
        return None
    return norm_ops.gated_adaln(h, attn, gate, scale[:, None], folded_shift(shift, scale, bias)[:, None], weight,
                                norm_eps(norm, h), "layer")


def _residual(h: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    if y.shape != h.shape or not kiln_can_take(h, y, gate):
        return h + gate[:, None] * y
    return activation_ops.gated_residual_(h, y, gate[:, None])


def cogvideox_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``CogVideoXBlock.forward`` with its seams fused (see the module's docstring)."""

    def forward(hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, attention_kwargs=None):
        h, c = hidden_states, encoder_hidden_states
        if not _fits(module, h, c, temb):
            return original(hidden_states, encoder_hidden_states, temb, image_rotary_emb, attention_kwargs)
        text = c.shape[1]
        norm_h, norm_c, gate_msa, enc_gate_msa = module.norm1(h, c, temb)
        attn_h, attn_c = module.attn1(hidden_states=norm_h, encoder_hidden_states=norm_c,
                                      image_rotary_emb=image_rotary_emb, **(attention_kwargs or {}))
        norm2 = module.norm2
        shift, scale, gate_ff, enc_shift, enc_scale, enc_gate_ff = norm2.linear(norm2.silu(temb)).chunk(6, dim=1)
        seams = []
        for x, attn, gate, x_scale, x_shift in ((h, attn_h, gate_msa, scale, shift),
                                                (c, attn_c, enc_gate_msa, enc_scale, enc_shift)):
            fused = _seam(norm2.norm, x, attn, gate, x_scale, x_shift)
            if fused is None:
                x = x + gate * attn
                fused = x, norm2.norm(x) * (1 + x_scale[:, None]) + x_shift[:, None]
            seams.append(fused)
        (h, norm_h), (c, norm_c) = seams
        ff = module.ff(torch.cat([norm_c, norm_h], dim=1))
        return _residual(h, ff[:, text:], gate_ff), _residual(c, ff[:, :text], enc_gate_ff)

    return forward
