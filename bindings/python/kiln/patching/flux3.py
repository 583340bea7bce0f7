"""FLUX.3's attention (diffusers' ``Flux3Attention``, in its per-mode and joint blocks) with its
q/k work fused.

diffusers' processor takes q and k [B, S, H, D] to fp32, normalises each head with the
per-head RMSNorms (whose weights the loader keeps in fp32), rotates them with the fp32 table
(interleaved pairs) and takes them back to v's dtype: in bf16, six copies and casts of q and
of k around the norm and the rotation's elementwise kernels. kiln's processor computes the norms
and the rotation of q and k in one ``kiln.head_norm_rope``, in fp32 inside the kernel, with the
norms' weights rounded to v's dtype (kept between calls). diffusers rounds once, after the
rotation; kiln rounds the normalised heads too, as its per-head norm kernel does: the two differ
by an ulp of v's dtype at most. Everything else is diffusers' (the projections, the attention
backend, the output projection); where the kernel does not compute what diffusers does (no
table, a table kiln does not read, hooks on the norms, autograd, another norm) the processor
runs diffusers' formula itself.
"""

from typing import Optional

import torch

from .. import rope_ops
from .flux import FluxAttnProcessor
from .forwards import _kept_weight, any_hooks, kiln_can_take, norm_eps

# diffusers normalises fp32 heads: an eps of None is fp32's.
_FP32 = torch.empty(0)


class Flux3AttnProcessor(FluxAttnProcessor):
    """diffusers' ``Flux3AttnProcessor.__call__`` with the fp32 per-head q/k RMSNorms and the
    rotation as one ``kiln.head_norm_rope`` (``fuse_norms``: the module's q/k norms are RMSNorms
    that kernel computes, checked when patched), or, without, the rotation alone as one
    ``kiln.rope`` of the normalised fp32 heads. FLUX's processor's settings, diffusers' functions
    (from the original processor's module) and table check."""

    def _fused(self, attn, query, key, value, image_rotary_emb):
        """(q weight, k weight, eps, (cos, sin)) for one ``kiln.head_norm_rope`` of q and k in
        v's dtype, or None."""
        if not self.fuse_norms or image_rotary_emb is None or query.dtype != value.dtype:
            return None
        table = self._table(query, key, image_rotary_emb)
        norms = (attn.norm_q, attn.norm_k)
        if table is None or any(n is None or any_hooks(n) for n in norms) or not kiln_can_take(query, key, value):
            return None
        recorded = list(table) + [p for n in norms for p in n.parameters()]
        if torch.is_grad_enabled() and any(t.requires_grad for t in recorded):
            return None
        weights = []
        for norm in norms:
            weight = getattr(norm, "weight", None)
            if weight is None:
                weights.append(None)
            elif not isinstance(weight, torch.Tensor) or weight.shape != (query.shape[-1],) \
                    or weight.device != query.device:
                return None
            else:
                same = weight.dtype == query.dtype
                weights.append(weight if same else _kept_weight(norm, query.dtype, lambda w: w))
        eps = {norm_eps(n, _FP32) for n in norms}
        return (*weights, eps.pop(), table) if len(eps) == 1 else None

    def __call__(self, attn, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                 image_rotary_emb: Optional[tuple] = None) -> torch.Tensor:
        query, key, value = self._qkv(attn, hidden_states)
        query = query.unflatten(-1, (attn.heads, -1))
        key = key.unflatten(-1, (attn.heads, -1))
        value = value.unflatten(-1, (attn.heads, -1))
        fused = self._fused(attn, query, key, value, image_rotary_emb)
        if fused is not None:
            wq, wk, eps, (cos, sin) = fused
            query, key = rope_ops.head_norm_rope(query, key, wq, wk, cos, sin, eps, interleaved=True,
                                                 layout="bshd")
        else:
            query = attn.norm_q(query.float())
            key = attn.norm_k(key.float())
            if image_rotary_emb is not None:
                query, key = self._rotate(query, key, image_rotary_emb)
            query, key = query.to(value.dtype), key.to(value.dtype)
        hidden_states = self._dispatch(query, key, value, attn_mask=attention_mask,
                                       backend=self._attention_backend, parallel_config=self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3)
        hidden_states = hidden_states.to(query.dtype)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states
