"""FLUX's replacements (diffusers' ``FluxTransformer2DModel``): its AdaLN modules (norm plus
modulation as one ``kiln.adaln``; CogVideoX's ``CogVideoXLayerNormZero`` too) and its attention
processor: the per-head q/k RMSNorms and
the rotation of q and k as one ``kiln.head_norm_rope`` where the norms are RMSNorms kiln
computes and no autograd graph is recorded (the fused op has no backward), else the norms as
modules (patched as norms) and the rotation as one ``kiln.rope``.
"""

import sys
from typing import Callable, Optional

import torch

from .. import norm_ops, rope_ops
from .forwards import (SharedAttentionSettings, argument_binder, fused_head_norms, kiln_can_take, norm_eps,
                       signature_kept)

# chunk count, the emb argument's name, the order of the chunks, what is returned after x.
ADALN_LAYOUTS = {
    "zero": (6, "emb", ("shift", "scale", "gate", "shift_mlp", "scale_mlp", "gate_mlp"),
             ("gate", "shift_mlp", "scale_mlp", "gate_mlp")),
    "zero_single": (3, "emb", ("shift", "scale", "gate"), ("gate",)),
    "continuous": (2, "conditioning_embedding", ("scale", "shift"), ()),
    # AdaLayerNorm with chunk_dim 1 (CogVideoX's and OmniGen's output norm)
    "shift_scale": (2, "temb", ("shift", "scale"), ()),
}


def folded_shift(shift: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """The shift kiln.adaln and kiln.gated_adaln take for a LayerNorm with ``bias``:
    ``(x^ w + b) (1 + scale) + shift = x^ w (1 + scale) + (shift + b (1 + scale))``, one small
    ``[B, D]`` product beside the pass over x."""
    return shift if bias is None else torch.addcmul(shift, bias, 1 + scale)


def modulated_norm(nm: torch.nn.Module, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                   norm: str, *also: torch.Tensor) -> torch.Tensor:
    """``nm(x) * (1 + scale[:, None]) + shift[:, None]`` for x ``[B, T, D]`` and scale and shift
    ``[B, D]`` (chunks of an embedding, read in place; ``also``: other tensors kiln must take
    with them) as one ``kiln.adaln`` (``norm``: ``"layer"`` or ``"rms"``), else as written. A
    LayerNorm's bias folds into the shift (folded_shift)."""
    params = [getattr(nm, name, None) for name in ("weight", "bias")]
    weight, bias = [p if isinstance(p, torch.Tensor) else None for p in params]
    tensors = (x, scale, shift, *also, *[p for p in (weight, bias) if p is not None])
    if scale.dim() == 2 and scale.shape[0] == x.shape[0] and scale.shape[1] == x.shape[2] and x.dim() == 3 \
            and kiln_can_take(*tensors, differentiable=True):
        return norm_ops.adaln(x, scale[:, None], folded_shift(shift, scale, bias)[:, None], weight,
                              norm_eps(nm, x), norm)
    return nm(x) * (1 + scale[:, None]) + shift[:, None]


def modulated_module(emb_name: str, order: tuple, returned: tuple, norm: str, modulation: Callable) -> Callable:
    """A factory for an AdaLN module's forward of (x, ``emb_name``): ``modulation(module, x, emb)``
    (the [B, chunks * D] rows, or None where the module's own forward must run) chunked in
    ``order``, ``norm(x) * (1 + scale) + shift`` one ``kiln.adaln`` reading scale and shift in place
    (modulated_norm; ``norm``: ``"layer"`` or ``"rms"``), and the ``returned`` chunks after it."""

    def factory(module: torch.nn.Module, original: Callable) -> Callable:
        bind = argument_binder(original)

        def forward(*args, **kwargs):
            a = bind(args, kwargs)
            if a is None:
                return original(*args, **kwargs)
            x, e = a.get("x"), a.get(emb_name)
            if getattr(module, "emb", None) is not None or not isinstance(x, torch.Tensor) \
                    or not isinstance(e, torch.Tensor) or x.dim() != 3:
                return original(*args, **kwargs)
            rows = modulation(module, x, e)
            if rows is None:
                return original(*args, **kwargs)
            parts = dict(zip(order, rows.chunk(len(order), dim=1)))
            out = modulated_norm(module.norm, x, parts["scale"], parts["shift"], norm, rows)
            if not returned:
                return out
            return (out,) + tuple(parts[name] for name in returned)

        return forward

    return factory


def adaln_module(layout: str, norm: str) -> Callable:
    """diffusers' ``AdaLayerNormZero`` / ``AdaLayerNormZeroSingle`` /
    ``AdaLayerNormContinuous`` / ``AdaLayerNorm`` (chunk_dim 1): ``emb = linear(silu(emb))`` as the
    module computes it, then the modulated norm as one ``kiln.adaln`` (modulated_module)."""
    _, emb_name, order, returned = ADALN_LAYOUTS[layout]

    def modulation(module: torch.nn.Module, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        silu = module.silu(e)
        return module.linear(silu.to(x.dtype) if layout == "continuous" else silu)

    return modulated_module(emb_name, order, returned, norm, modulation)


def layer_norm_zero(norm: str) -> Callable:
    """diffusers' ``CogVideoXLayerNormZero``: ``linear(silu(temb))`` as the module computes it,
    its six chunks (shift, scale, gate, then the text's), and the video's and the text's
    ``norm(x) * (1 + scale) + shift`` each as one ``kiln.adaln`` (modulated_norm); the gates
    returned as the module returns them."""

    def factory(module: torch.nn.Module, original: Callable) -> Callable:
        bind = argument_binder(original)

        def forward(*args, **kwargs):
            a = bind(args, kwargs)
            if a is None:
                return original(*args, **kwargs)
            h, enc, temb = a.get("hidden_states"), a.get("encoder_hidden_states"), a.get("temb")
            if not all(isinstance(t, torch.Tensor) for t in (h, enc, temb)):
                return original(*args, **kwargs)
            emb = module.linear(module.silu(temb))
            shift, scale, gate, enc_shift, enc_scale, enc_gate = emb.chunk(6, dim=1)
            h = modulated_norm(module.norm, h, scale, shift, norm, emb)
            enc = modulated_norm(module.norm, enc, enc_scale, enc_shift, norm, emb)
            return h, enc, gate[:, None, :], enc_gate[:, None, :]

        return forward

    return factory


@signature_kept
class FluxAttnProcessor(SharedAttentionSettings):
    """diffusers' ``FluxAttnProcessor.__call__`` with the two ``apply_rotary_emb`` calls as
    one ``kiln.rope`` (interleaved pairs, [B, S, H, D]); everything else is diffusers'."""

    def __init__(self, original: object, fuse_norms: bool = False):
        self.original = original
        # The module's q/k norms are RMSNorms one kiln call computes (checked when patched).
        self.fuse_norms = fuse_norms
        module = sys.modules[type(original).__module__]
        self._qkv = module._get_qkv_projections
        self._apply_rotary_emb = module.apply_rotary_emb
        self._dispatch = module.dispatch_attention_fn

    @staticmethod
    def _heads(attn) -> tuple:
        """The split of the projections' last dimension into heads: by FLUX's attention's
        ``head_dim`` (the head count left to follow, as under tensor parallelism), or by the
        head count of an attention with no ``head_dim`` (diffusers' ``Attention`` of Bria
        FIBO's single blocks, whose processor splits so)."""
        head_dim = getattr(attn, "head_dim", None)
        return (-1, head_dim) if isinstance(head_dim, int) else (attn.heads, -1)

    @staticmethod
    def _table(query, key, image_rotary_emb, text: int = 0):
        """(cos, sin) kiln's rotation reads as they are for q and k [B, S, H, D] of `text` +
        the image's tokens, or None."""
        cos, sin = image_rotary_emb if isinstance(image_rotary_emb, tuple) else (None, None)
        if (isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor) and query.dim() == 4
                and query.shape[:2] == key.shape[:2] and query.shape[3] == key.shape[3]
                and cos.dim() == 2 and cos.shape == sin.shape
                and cos.shape[0] == query.shape[1] + text and cos.shape[1] == query.shape[3]
                and cos.dtype in (torch.float32, query.dtype)
                and sin.dtype == cos.dtype and cos.device == query.device):
            return cos, sin
        return None

    def _rotate(self, query, key, image_rotary_emb):
        table = self._table(query, key, image_rotary_emb)
        if table is not None and kiln_can_take(query, key, differentiable=True):
            return rope_ops.rope(query, key, *table, interleaved=True, layout="bshd")
        return (self._apply_rotary_emb(query, image_rotary_emb, sequence_dim=1),
                self._apply_rotary_emb(key, image_rotary_emb, sequence_dim=1))

    def _fused_norms(self, attn, query, key, encoder_query, encoder_key, image_rotary_emb):
        """(weights, eps, table) for one ``kiln.head_norm_rope`` per stream where it computes
        what the norms and the rotation compute (the norms' weights of q's dtype or none, one
        eps, a table kiln reads, no graph to record), else None."""
        if not self.fuse_norms or image_rotary_emb is None:
            return None
        text = 0 if encoder_query is None else encoder_query.shape[1]
        table = self._table(query, key, image_rotary_emb, text)
        names = ("norm_q", "norm_k") + (() if encoder_query is None else ("norm_added_q", "norm_added_k"))
        streams = (key,) if encoder_query is None else (key, encoder_query, encoder_key)
        norms = fused_head_norms([getattr(attn, name) for name in names], query, *streams)
        if norms is None or table is None or (torch.is_grad_enabled() and any(t.requires_grad for t in table)):
            return None
        return (*norms, table)

    def _norm_rotate(self, query, key, fused, text: int):
        """The fused norms and rotation of q and k [B, text + S, H, D]: in place on the joint
        attention's concatenation (a new tensor), text and image tokens each with their norms'
        weights and their rows of the table; else new tensors."""
        weights, eps, (cos, sin) = fused
        if text == 0:
            return rope_ops.head_norm_rope(query, key, weights[0], weights[1], cos, sin, eps,
                                           interleaved=True, layout="bshd")
        for part, (wq, wk) in ((slice(0, text), weights[2:]), (slice(text, None), weights[:2])):
            rope_ops.head_norm_rope_(query[:, part], key[:, part], wq, wk, cos[part], sin[part], eps,
                                     interleaved=True, layout="bshd")
        return query, key

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor = None,
                 attention_mask: Optional[torch.Tensor] = None,
                 image_rotary_emb: Optional[torch.Tensor] = None) -> torch.Tensor:
        query, key, value, encoder_query, encoder_key, encoder_value = self._qkv(
            attn, hidden_states, encoder_hidden_states)
        heads = self._heads(attn)
        query = query.unflatten(-1, heads)
        key = key.unflatten(-1, heads)
        value = value.unflatten(-1, heads)
        joint = attn.added_kv_proj_dim is not None
        if joint:
            encoder_query = encoder_query.unflatten(-1, heads)
            encoder_key = encoder_key.unflatten(-1, heads)
            encoder_value = encoder_value.unflatten(-1, heads)
        fused = self._fused_norms(attn, query, key, encoder_query if joint else None,
                                  encoder_key if joint else None, image_rotary_emb)
        if fused is None:
            query = attn.norm_q(query)
            key = attn.norm_k(key)
        if joint:
            if fused is None:
                encoder_query = attn.norm_added_q(encoder_query)
                encoder_key = attn.norm_added_k(encoder_key)
            query = torch.cat([encoder_query, query], dim=1)
            key = torch.cat([encoder_key, key], dim=1)
            value = torch.cat([encoder_value, value], dim=1)
        if fused is not None:
            query, key = self._norm_rotate(query, key, fused, encoder_query.shape[1] if joint else 0)
        elif image_rotary_emb is not None:
            query, key = self._rotate(query, key, image_rotary_emb)
        hidden_states = self._dispatch(query, key, value, attn_mask=attention_mask,
                                       backend=self._attention_backend, parallel_config=self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3)
        hidden_states = hidden_states.to(query.dtype)
        if encoder_hidden_states is not None:
            encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
                [encoder_hidden_states.shape[1], hidden_states.shape[1] - encoder_hidden_states.shape[1]], dim=1)
            hidden_states = attn.to_out[0](hidden_states.contiguous())
            hidden_states = attn.to_out[1](hidden_states)
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states.contiguous())
            return hidden_states, encoder_hidden_states
        return hidden_states
