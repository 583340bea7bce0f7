"""CogVideoX's attention processor (diffusers' ``CogVideoXAttnProcessor2_0``) with its rotation in
one kiln launch.

CogVideoX-5b (and 1.5) rotate the video tokens' q and k ([B, H, S, D], after the per-head q/k
LayerNorms) by the pipeline's fp32 tables, interleaved pairs, through diffusers'
``apply_rotary_emb``: about a dozen kernels a tensor with fp32 temporaries (the halves
unbound, negated, stacked, each product and the sum in fp32, the result rounded and copied back
into the slice). kiln rotates the video tokens of q and k in one ``kiln.rope_``, in place on the
slices diffusers writes (the norms' outputs, tensors of the processor's own); with autograd, one
``kiln.rope`` written into them. The projections, the norms, the attention and the split of the
output are diffusers'.
"""

import importlib

import torch
import torch.nn.functional as F

from .. import rope_ops
from .forwards import kiln_can_take, signature_kept


def _table(video_q: torch.Tensor, image_rotary_emb):
    """(cos, sin) kiln's rotation reads as they are for the video tokens ``video_q`` [B, H, S, D],
    or None."""
    cos, sin = image_rotary_emb if isinstance(image_rotary_emb, tuple) and len(image_rotary_emb) == 2 \
        else (None, None)
    if isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor) and cos.dim() == 2 \
            and cos.shape == sin.shape == video_q.shape[2:] and cos.dtype == sin.dtype \
            and cos.dtype in (torch.float32, video_q.dtype) and cos.device == sin.device == video_q.device:
        return cos, sin
    return None


@signature_kept
class CogVideoXAttnProcessor:
    """diffusers' ``CogVideoXAttnProcessor2_0.__call__`` with the video tokens' rotation one kiln
    launch (see the module's docstring)."""

    def __init__(self, original: object):
        self.original = original
        # diffusers' formula, from the package the original processor comes from.
        package = type(original).__module__.rsplit(".", 1)[0]
        self._apply_rotary_emb = importlib.import_module(".embeddings", package).apply_rotary_emb

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                 attention_mask=None, image_rotary_emb=None):
        if image_rotary_emb is None or attn.is_cross_attention:
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        text = encoder_hidden_states.size(1)
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        batch, sequence, _ = hidden_states.shape
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence, batch)
            attention_mask = attention_mask.view(batch, attn.heads, -1, attention_mask.shape[-1])
        query, key, value = (proj(hidden_states) for proj in (attn.to_q, attn.to_k, attn.to_v))
        head_dim = key.shape[-1] // attn.heads
        query, key, value = (t.view(batch, -1, attn.heads, head_dim).transpose(1, 2) for t in (query, key, value))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        self._rotate(query, key, text, image_rotary_emb)
        hidden_states = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=0.0,
                                                       is_causal=False)
        hidden_states = hidden_states.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        encoder_hidden_states, hidden_states = hidden_states.split([text, hidden_states.size(1) - text], dim=1)
        return hidden_states, encoder_hidden_states

    def _rotate(self, query: torch.Tensor, key: torch.Tensor, text: int, image_rotary_emb) -> None:
        """Rotates the video tokens (after the first ``text``) of q and k in place, as diffusers'
        slice assignment does."""
        video_q, video_k = query[:, :, text:], key[:, :, text:]
        table = _table(video_q, image_rotary_emb)
        if table is not None and video_k.shape == video_q.shape and kiln_can_take(query, key, differentiable=True) \
                and not (torch.is_grad_enabled() and any(t.requires_grad for t in table)):
            if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad):
                video_q[...], video_k[...] = rope_ops.rope(video_q, video_k, *table, interleaved=True, layout="bhsd")
            else:
                rope_ops.rope_(video_q, video_k, *table, interleaved=True, layout="bhsd")
            return
        query[:, :, text:] = self._apply_rotary_emb(video_q, image_rotary_emb)
        key[:, :, text:] = self._apply_rotary_emb(video_k, image_rotary_emb)
