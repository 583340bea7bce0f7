"""Stable Audio 3's DiT block (diffusers' ``StableAudio3DiTBlock``): its seams.

The block's modulation is ``to_scale_shift_gate + global_modulation`` in six [B, D] chunks, each
gated branch scaled by ``sigmoid(1 - gate)``; its norms are RMSNorms scaled by a ``gamma``,
normalised and scaled in fp32 and rounded once. diffusers runs each seam as a norm and three to
five elementwise kernels; kiln:

* ``pre_norm(h) * (1 + scale_attn) + shift_attn`` -> one ``kiln.adaln`` (gamma in the call);
* ``h + attn * sigmoid(1 - gate_attn)`` then ``cross_attend_norm(h)`` (no modulation) -> one
  ``kiln.gated_adaln``, its scale and shift zero;
* ``h + cross`` then ``ff_norm(h) * (1 + scale_ff) + shift_ff`` -> one ``kiln.gated_adaln``, its
  gate one;
* ``h + ff * sigmoid(1 - gate_ff)`` -> one ``kiln.gated_residual_``.

Each seam is rounded once to h's dtype where diffusers rounds after the norm and after each
product and sum. The attentions and the feed-forward are the block's own (kiln's where patched).
A block called with ``local_seq`` (inpainting, its projection added between the cross-attention
and the feed-forward) keeps diffusers' forward, as does anything kiln does not take (autograd,
hooks on the norms, operands of another dtype or device) and torch.compile's tracing, where
Inductor fuses the seams itself.
"""

from typing import Callable, Optional

import torch

from .. import activation_ops, norm_ops
from .forwards import any_hooks, kiln_can_take, norm_eps, records_parameters
from .ltx import constant

BLOCK_OPS = "adaln + gated_adaln + gated_residual"
NORMS = ("pre_norm", "cross_attend_norm", "ff_norm")


def _fits(module, h, global_modulation, local_seq) -> bool:
    if torch.compiler.is_compiling() or local_seq is not None or records_parameters(module):
        return False
    if not (isinstance(h, torch.Tensor) and h.dim() == 3 and isinstance(global_modulation, torch.Tensor)):
        return False
    d = h.shape[-1]
    if global_modulation.shape != (h.shape[0], 6 * d):
        return False
    gammas = []
    for name in NORMS:
        norm = getattr(module, name)
        gamma = getattr(norm, "gamma", None)
        if any_hooks(norm) or not isinstance(gamma, torch.Tensor) or gamma.shape != (d,):
            return False
        gammas.append(gamma)
    return kiln_can_take(h, global_modulation, module.to_scale_shift_gate, *gammas)


def stable_audio3_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``StableAudio3DiTBlock.forward`` with its seams fused (see the module's docstring)."""
    zeros, ones = {}, {}

    def forward(hidden_states: torch.Tensor, context: torch.Tensor, global_modulation: torch.Tensor,
                rope: torch.Tensor, context_mask: Optional[torch.Tensor] = None,
                local_seq: Optional[torch.Tensor] = None, num_memory_tokens: int = 0) -> torch.Tensor:
        h = hidden_states
        if not _fits(module, h, global_modulation, local_seq):
            return original(hidden_states, context, global_modulation, rope, context_mask, local_seq,
                            num_memory_tokens)
        b, d = h.shape[0], h.shape[-1]
        modulation = (module.to_scale_shift_gate + global_modulation).unsqueeze(1)
        scale_attn, shift_attn, gate_attn, scale_ff, shift_ff, gate_ff = modulation.chunk(6, dim=-1)
        zero = constant(zeros, h, lambda: h.new_zeros(1, 1, d)).expand(b, 1, d)
        one = constant(ones, h, lambda: h.new_ones(1, 1, d)).expand(b, 1, d)
        pre, cross_norm, ff_norm = (getattr(module, name) for name in NORMS)

        normed = norm_ops.adaln(h, scale_attn, shift_attn, pre.gamma, norm_eps(pre, h), "rms")
        attn_out = module.self_attn(normed, rope=rope)
        h, normed = norm_ops.gated_adaln(h, attn_out, torch.sigmoid(1 - gate_attn), zero, zero, cross_norm.gamma,
                                         norm_eps(cross_norm, h), "rms")
        cross = module.cross_attn(normed, context=context, context_mask=context_mask)
        h, normed = norm_ops.gated_adaln(h, cross, one, scale_ff, shift_ff, ff_norm.gamma, norm_eps(ff_norm, h),
                                         "rms")
        return activation_ops.gated_residual_(h, module.ff(normed), torch.sigmoid(1 - gate_ff))

    return forward
