"""Qwen-Image 2.1's blocks (diffusers' ``QwenImage21TransformerBlock``: one stream of text,
condition images and the target image) with the seams between their matmuls fused, and its
attention's q/k norms and rotation in kiln's launches.

The attention (diffusers' default ``QwenImage21AttnProcessor``: the prompt's segments, then the
image, by SDPA; with a KV cache of the prompt's keys and values across steps) prepares q and k
in a module-level function its processors share: each head's RMSNorm, then the rotation by
complex frequencies (``apply_rotary_emb_qwen``, ``use_real=False``), about ten kernels with fp32
temporaries each for q and for k. kiln's processor is diffusers' ``__call__`` run with kiln's
preparation in that function's place: where the norms are RMSNorms kiln computes and no graph is
recorded, one ``kiln.head_norm_rope`` normalises and rotates q and k (the angles' real and
imaginary parts as fp32 half tables, made once a forward); otherwise the norm modules and one
``kiln.rope``. The segments, the KV cache and the attention calls stay diffusers', and
torch.compile traces it all (Inductor generates no complex arithmetic: diffusers' rotation would
run eagerly in the compiled model). (The flex processor is left: the model builds its block mask
for processors of that class.)

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
kiln does not compute) runs diffusers' forward, and so does torch.compile's tracing: Inductor
reads the per-token selection inside the kernels it fuses, where kiln's seams in the graph would
read scales and gates made in each block's graph (1-2% slower in bench/diagnostics/qwen_compile.py).
"""

import sys
import types
from typing import Callable, Optional

import torch

from .. import rope_ops
from .forwards import SharedAttentionSettings, any_hooks, fused_head_norms, kiln_can_take, records_parameters
from .per_forward import OncePerForward
from .qwen_image import _freqs_fit, _gated_modulated, _modulated, _parts, _residual

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
    return not torch.compiler.is_compiling() and _takes(module, h, modulation, mask)


def _takes(module: torch.nn.Module, h, modulation, mask) -> bool:
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
        x = _modulated(module.img_norm1, h, zero, scale1)
        attn = module.attn(hidden_states=x, attention_mask=attention_mask, rotary_emb=rotary_emb,
                           layer_cache=layer_cache, kv_cache_mode=kv_cache_mode, cache_write_slice=cache_write_slice,
                           segments=segments, key_valid=key_valid)
        h, x = _gated_modulated(module.img_norm2, h, attn, gate1, zero, scale2)
        h = _residual(h, module.img_mlp(x), gate2)
        if h.dtype == torch.float16:
            h = h.clip(-65504, 65504)
        return h

    return forward


# ---- the attention -----------------------------------------------------------------------

_HALF_TABLES = OncePerForward(_parts)


def _half_tables(freqs, q: torch.Tensor, k: torch.Tensor):
    """(cos, sin) fp32 half tables of complex64 frequencies [S, D / 2] for q and k [B, S, H, D],
    or None."""
    if not (_freqs_fit(freqs, q) and q.dim() == 4 and k.shape == q.shape):
        return None
    if torch.is_grad_enabled() and freqs.requires_grad:
        return None
    return _HALF_TABLES.get(freqs)


class QwenImage21AttnProcessor(SharedAttentionSettings):
    """diffusers' ``QwenImage21AttnProcessor.__call__`` with its q/k preparation kiln's (see the
    module's docstring)."""

    def __init__(self, original: object, fuse_norms: bool = False):
        self.original = original
        # The module's q/k norms are RMSNorms one kiln call computes (checked when patched).
        self.fuse_norms = fuse_norms
        self._apply_rotary_emb = sys.modules[type(original).__module__].apply_rotary_emb_qwen
        # diffusers' __call__ finds the preparation by its module-level name: a copy of it whose
        # globals give that name kiln's preparation runs the rest as diffusers wrote it. The copy's
        # globals have no __name__: Dynamo would guard their names as the diffusers module's
        # attributes (where the preparation is a plain function, not this bound method), and
        # without one guards the dictionary itself.
        call = type(original).__call__
        scope = dict(call.__globals__, _qwenimage21_prepare_qkv=self._prepare)
        del scope["__name__"]
        self._call = types.FunctionType(call.__code__, scope, call.__name__, call.__defaults__, call.__closure__)
        self._call.__kwdefaults__ = call.__kwdefaults__
        self._call.__module__ = call.__module__

    def __call__(self, attn, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
        return self._call(self, attn, hidden_states, **kwargs)

    def _normed_rotated(self, attn, query, key, value, rotary_emb):
        tables = None if rotary_emb is None else _half_tables(rotary_emb, query, key)
        norms = fused_head_norms([attn.norm_q, attn.norm_k], query, key) if self.fuse_norms else None
        if tables is not None and norms is not None:
            (wq, wk), eps = norms
            return rope_ops.head_norm_rope(query, key, wq, wk, *tables, eps, interleaved=True,
                                           rotary_dim=query.shape[3], layout="bshd")
        query = attn.norm_q(query).to(value.dtype)
        key = attn.norm_k(key).to(value.dtype)
        if rotary_emb is None:
            return query, key
        if tables is not None and kiln_can_take(query, key, differentiable=True):
            return rope_ops.rope(query, key, *tables, interleaved=True, rotary_dim=query.shape[3], layout="bshd")
        return (self._apply_rotary_emb(query, rotary_emb, use_real=False),
                self._apply_rotary_emb(key, rotary_emb, use_real=False))

    def _prepare(self, attn, hidden_states, rotary_emb, layer_cache, kv_cache_mode, cache_write_slice):
        """diffusers' ``_qwenimage21_prepare_qkv`` with the norms and rotation kiln's."""
        head_dim = attn.inner_dim // attn.heads
        query, key, value = (proj(hidden_states).unflatten(-1, (-1, head_dim))
                             for proj in (attn.to_q, attn.to_k, attn.to_v))
        query, key = self._normed_rotated(attn, query, key, value, rotary_emb)
        if layer_cache is not None:
            if kv_cache_mode == "extract" and cache_write_slice is not None:
                layer_cache.store(key[:, cache_write_slice].clone(), value[:, cache_write_slice].clone())
            elif kv_cache_mode == "cached":
                cached_k, cached_v = layer_cache.get()
                key = torch.cat([cached_k, key], dim=1)
                value = torch.cat([cached_v, value], dim=1)
        return query, key, value, query.shape[1]
