"""Wan's attention processor (diffusers' ``WanTransformer3DModel``: Wan 2.1, Wan 2.2 and the
models built on its blocks, SkyReels-V2's among them): its q/k RMSNorms across heads and the rotation of q and k as
one ``kiln.rms_norm_rope``, or, where autograd records (that op has no backward) or the
norms are not RMSNorms kiln computes, the norm modules and one ``kiln.rope``.

diffusers rotates q and then k by a formula of about a dozen kernels each, with fp32
temporaries, that reads cos at even columns and sin at odd ones of its ``[1, S, 1, D]``
tables. Those columns are what kiln's half tables hold (one angle a rotation pair), so
kiln reads them, made contiguous once for all the blocks that share a forward's tables:
any table, not only the duplicated one diffusers builds, turns by the same angles.
Everything else is diffusers' code, called in diffusers' order.
"""

import sys
from typing import Optional

import torch

from .. import rope_ops
from .forwards import SharedAttentionSettings, any_hooks, kiln_can_take, norm_eps, signature_kept
from .per_forward import OncePerForward


def _halves(cos: torch.Tensor, sin: torch.Tensor):
    return cos[..., 0::2].contiguous(), sin[..., 1::2].contiguous()


# Looked up when called, so that a test may count the copies.
_HALF_TABLES = OncePerForward(lambda cos, sin: _halves(cos, sin))


def diffusers_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' rotation inside ``WanAttnProcessor.__call__``, for the calls kiln does not take."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c = cos[..., 0::2]
    s = sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out.type_as(x)


def _table_fits(table, x: torch.Tensor) -> bool:
    """A [B or 1, S, 1, D] table of fp32 or x's dtype for x [B, S, H, D]."""
    return (isinstance(table, torch.Tensor) and table.dim() == 4 and table.device == x.device
            and table.dtype in (torch.float32, x.dtype) and table.shape[0] in (1, x.shape[0])
            and table.shape[1] == x.shape[1] and table.shape[2] == 1 and table.shape[3] == x.shape[3])


def _rotate(query: torch.Tensor, key: torch.Tensor, rotary_emb):
    cos, sin = rotary_emb
    if (query.dim() == 4 and key.dim() == 4 and query.shape[:2] == key.shape[:2]
            and query.shape[3] == key.shape[3] and query.shape[3] % 2 == 0
            and _table_fits(cos, query) and _table_fits(sin, query) and cos.dtype == sin.dtype
            and kiln_can_take(query, key, differentiable=True)):
        cos_half, sin_half = _HALF_TABLES.get(cos, sin)
        return rope_ops.rope(query, key, cos_half, sin_half, interleaved=True,
                             rotary_dim=query.shape[3], layout="bshd")
    return diffusers_rotation(query, cos, sin), diffusers_rotation(key, cos, sin)


def _norms_and_rotation(attn, query: torch.Tensor, key: torch.Tensor, rotary_emb):
    """``norm_q(query)``, ``norm_k(key)`` and their rotation as one ``kiln.rms_norm_rope`` of
    q and k [B, S, C], where it computes what they do (weights of q's dtype, one eps, no
    hooks on the norms, no graph to record); else None."""
    cos, sin = rotary_emb
    norms = (attn.norm_q, attn.norm_k)
    weights = [getattr(n, "weight", None) for n in norms]
    heads = attn.heads
    if (query.dim() != 3 or query.shape != key.shape or query.shape[2] % heads
            or not all(isinstance(w, torch.Tensor) and w.shape == (query.shape[2],) for w in weights)
            or any(any_hooks(n) for n in norms) or not kiln_can_take(query, key, *weights)):
        return None
    head_dim = query.shape[2] // heads
    eps = norm_eps(norms[0], query)
    heads_view = query.unflatten(2, (heads, head_dim))
    if (head_dim % 4 or eps != norm_eps(norms[1], key) or not _table_fits(cos, heads_view)
            or not _table_fits(sin, heads_view) or cos.dtype != sin.dtype):
        return None
    cos_half, sin_half = _HALF_TABLES.get(cos, sin)
    return rope_ops.rms_norm_rope(query, key, weights[0], weights[1], eps, cos_half, sin_half,
                                  head_dim=head_dim)


@signature_kept
class WanAttnProcessor(SharedAttentionSettings):
    """diffusers' ``WanAttnProcessor.__call__`` with q and k normalised and rotated in one
    ``kiln.rms_norm_rope`` (``fuse_norms``) or rotated in one ``kiln.rope``; the projections,
    image-context attention (I2V) and attention backend are diffusers' (the backend and
    parallel settings are the original processor's: set on either, both see them)."""

    def __init__(self, original: object, fuse_norms: bool = False):
        self.original = original
        # The module's q/k norms are RMSNorms one kiln call computes (checked when patched).
        self.fuse_norms = fuse_norms
        module = sys.modules[type(original).__module__]
        self._qkv = module._get_qkv_projections
        self._added_kv = module._get_added_kv_projections
        self._dispatch = module.dispatch_attention_fn

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor] = None,
                 attention_mask: Optional[torch.Tensor] = None, rotary_emb=None) -> torch.Tensor:
        encoder_hidden_states_img = None
        if attn.add_k_proj is not None:
            # diffusers' text context is its last 512 tokens; what precedes them is the image's.
            image_context_length = encoder_hidden_states.shape[1] - 512
            encoder_hidden_states_img = encoder_hidden_states[:, :image_context_length]
            encoder_hidden_states = encoder_hidden_states[:, image_context_length:]

        query, key, value = self._qkv(attn, hidden_states, encoder_hidden_states)
        fused = None
        if self.fuse_norms and rotary_emb is not None:
            fused = _norms_and_rotation(attn, query, key, rotary_emb)
        if fused is not None:
            query, key = fused
        else:
            query = attn.norm_q(query)
            key = attn.norm_k(key)
        query = query.unflatten(2, (attn.heads, -1))
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        if fused is None and rotary_emb is not None:
            query, key = _rotate(query, key, rotary_emb)

        hidden_states_img = None
        if encoder_hidden_states_img is not None:
            key_img, value_img = self._added_kv(attn, encoder_hidden_states_img)
            key_img = attn.norm_added_k(key_img)
            key_img = key_img.unflatten(2, (attn.heads, -1))
            value_img = value_img.unflatten(2, (attn.heads, -1))
            hidden_states_img = self._dispatch(query, key_img, value_img, attn_mask=None, dropout_p=0.0,
                                               is_causal=False, backend=self._attention_backend,
                                               parallel_config=self._parallel(False))
            hidden_states_img = hidden_states_img.flatten(2, 3)
            hidden_states_img = hidden_states_img.type_as(query)

        hidden_states = self._dispatch(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend, parallel_config=self._parallel(encoder_hidden_states is None))
        hidden_states = hidden_states.flatten(2, 3)
        hidden_states = hidden_states.type_as(query)
        if hidden_states_img is not None:
            hidden_states = hidden_states + hidden_states_img
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states

    def _parallel(self, self_attention: bool):
        """The context-parallel settings diffusers' Wan processor passes: its self-attention's
        alone (the cross-attentions' keys are not split across ranks)."""
        return self._parallel_config if self_attention else None


class SkyReelsV2AttnProcessor(WanAttnProcessor):
    """kiln's Wan processor for diffusers' ``SkyReelsV2AttnProcessor``, which computes what Wan's
    does but passes its context-parallel settings to every attention it dispatches."""

    def _parallel(self, self_attention: bool):
        return self._parallel_config
