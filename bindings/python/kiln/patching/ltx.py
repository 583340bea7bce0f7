"""LTX-Video's replacements: its attention processor (q/k RMSNorm and RoPE as one
``kiln.rms_norm_rope``) and its transformer block's AdaLN / gated-residual seams (its
rotary embedding: ltx_rope.py).

Everything else (projections, attention, masks, the feed-forward) stays diffusers' own
code, called in diffusers' order; anything kiln has no kernel for (other dtypes or
devices, mixed dtypes, autograd, weights still on the meta device under sequential
offload) takes diffusers' path.
"""

import sys
from typing import Callable, Optional

import torch

from .. import activation_ops, norm_ops, ops, rope_ops
from . import dit_block_chain, ltx_mask
from .forwards import SharedAttentionSettings, kiln_can_take, norm_eps, recording_a_graph, signature_kept

BLOCK_OPS = "adaln + gated_residual + gated_adaln"


def _diffusers_module(processor: object):
    return sys.modules[type(processor).__module__]


def constant(cache: dict, like: torch.Tensor, make: Callable[[], object]):
    """``make()``, kept in ``cache`` (one entry: for like's width, dtype and device) so that
    a constant operand costs no fill kernel per call; made afresh where a graph is recorded."""
    if recording_a_graph(like):
        return make()
    key = (like.shape[-1], like.dtype, like.device)
    if key not in cache:
        cache.clear()
        cache[key] = make()
    return cache[key]


def norm_weight(norm: torch.nn.Module, like: torch.Tensor, cache: dict) -> Optional[torch.Tensor]:
    weight = getattr(norm, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight
    # rms_norm_rope takes a weight; a norm without one multiplies by ones.
    return constant(cache, like, lambda: torch.ones(like.shape[-1], dtype=like.dtype, device=like.device))


@signature_kept
class LTXAttnProcessor(SharedAttentionSettings):
    """diffusers' ``LTXVideoAttnProcessor.__call__`` with ``norm_q``, ``norm_k`` and both
    ``apply_rotary_emb`` calls as one ``kiln.rms_norm_rope`` (angles from the grid where
    the rotary embedding carries one, else from diffusers' cos/sin), and the two norms of
    cross-attention as ``kiln.rms_norm``. The attention backend and parallel settings are
    the original processor's (set on either, both see them)."""

    def __init__(self, original: object):
        self.original = original
        self._ones = {}
        module = _diffusers_module(original)
        self._apply_rotary_emb = module.apply_rotary_emb
        self._dispatch = module.dispatch_attention_fn

    def _norms(self, attn, query, key, image_rotary_emb):
        """``norm_q(query)``, ``norm_k(key)`` then the rotation, as kiln calls where they can."""
        wq, wk = norm_weight(attn.norm_q, query, self._ones), norm_weight(attn.norm_k, key, self._ones)
        eps = norm_eps(attn.norm_q, query)
        if not kiln_can_take(query, key, wq, wk) or eps != norm_eps(attn.norm_k, key) \
                or query.dim() != 3 or wq.shape != (query.shape[-1],) or wk.shape != (key.shape[-1],):
            return self._diffusers_norms(attn, query, key, image_rotary_emb)
        if image_rotary_emb is None:
            return ops.rms_norm(query, wq, eps), ops.rms_norm(key, wk, eps)
        if query.shape != key.shape or query.shape[-1] < 6 or query.shape[-1] % 2:
            return self._diffusers_norms(attn, query, key, image_rotary_emb)
        grid = getattr(image_rotary_emb, "grid", None)
        if grid is not None and grid[0] * grid[1] * grid[2] == query.shape[1]:
            r = image_rotary_emb
            return rope_ops.rms_norm_rope(
                query, key, wq, wk, eps, grid=grid, rope_interpolation_scale=r.scale,
                base_num_frames=r.base_sizes[0], base_height=r.base_sizes[1], base_width=r.base_sizes[2],
                patch_size_t=r.patch_sizes[0], patch_size=r.patch_sizes[1], theta=r.theta)
        cos, sin = image_rotary_emb
        if table_fits(cos, query) and table_fits(sin, query):
            return rope_ops.rms_norm_rope(query, key, wq, wk, eps, cos, sin)
        return self._diffusers_norms(attn, query, key, image_rotary_emb)

    def _diffusers_norms(self, attn, query, key, image_rotary_emb):
        query, key = attn.norm_q(query), attn.norm_k(key)
        if image_rotary_emb is not None:
            query = self._apply_rotary_emb(query, image_rotary_emb)
            key = self._apply_rotary_emb(key, image_rotary_emb)
        return query, key

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor] = None,
                 attention_mask: Optional[torch.Tensor] = None,
                 image_rotary_emb: Optional[torch.Tensor] = None) -> torch.Tensor:
        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape)
        if attention_mask is not None:
            attention_mask = ltx_mask.prepare(attn, attention_mask, sequence_length, batch_size)
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states

        query = attn.to_q(hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
        query, key = self._norms(attn, query, key, image_rotary_emb)

        query = query.unflatten(2, (attn.heads, -1))
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        hidden_states = self._dispatch(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend, parallel_config=self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3)
        hidden_states = hidden_states.to(query.dtype)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states


def table_fits(table, x: torch.Tensor) -> bool:
    """A cos/sin table rms_norm_rope reads as it is: [S, C] or [B or 1, S, C], fp32 or x's dtype."""
    if not isinstance(table, torch.Tensor) or table.device != x.device:
        return False
    if table.dtype not in (torch.float32, x.dtype) or table.shape[-1] != x.shape[-1]:
        return False
    if table.dim() == 2:
        return table.shape[0] == x.shape[1]
    return table.dim() == 3 and table.shape[1] == x.shape[1] and table.shape[0] in (1, x.shape[0])


def _residual(h: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``h + y * gate`` as one kiln call where it can, else as diffusers writes it."""
    if y.shape == h.shape and kiln_can_take(h, y, gate):
        return activation_ops.gated_residual(h, y, gate)
    return h + y * gate


def ltx_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``LTXVideoTransformerBlock.forward`` with its seams fused:

    * ``norm1(h) * (1 + scale_msa) + shift_msa`` -> ``kiln.adaln`` (the table rows read
      beside temb's slices, the sum never materialised);
    * ``h + attn1 * gate_msa`` -> ``kiln.gated_residual``;
    * ``h + attn2`` then ``norm2(h) * (1 + scale_mlp) + shift_mlp`` -> one
      ``kiln.gated_adaln`` (gate 0 + 1: the add is exact, as diffusers' is);
    * ``h + ff * gate_mlp`` -> ``kiln.gated_residual_`` into the fresh h; or, where the next
      block of the model is patched too, one ``kiln.gated_adaln`` with that block's norm1
      AdaLN, whose output is handed over to it (dit_block_chain.py).

    The attentions and the feed-forward are the module's own, called as diffusers calls
    them. kiln rounds each seam once where diffusers rounds after every elementwise op
    (the outputs agree within an ulp or two per seam); the output dtype is the same."""
    constants = {}

    # diffusers' own signature (the probe checked the names), so no argument binding runs
    # per call.
    def forward(hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, encoder_attention_mask=None):
        h = hidden_states
        args = (hidden_states, encoder_hidden_states, temb, image_rotary_emb, encoder_attention_mask)
        kwargs = {}
        table = module.scale_shift_table
        w1, w2 = [w if isinstance(w, torch.Tensor) else None
                  for w in (getattr(module.norm1, "weight", None), getattr(module.norm2, "weight", None))]
        weights = [w for w in (w1, w2) if w is not None]
        if not (isinstance(h, torch.Tensor) and isinstance(temb, torch.Tensor) and h.dim() == 3
                and temb.dim() == 3 and kiln_can_take(h, temb, table, *weights)):
            return original(*args, **kwargs)
        b, t, d = h.shape
        n = table.shape[0]
        if n != 6 or table.shape[1] != d or temb.shape[0] != b or temb.shape[1] not in (1, t) \
                or temb.shape[2] != n * d or any(w.shape != (d,) for w in weights):
            return original(*args, **kwargs)
        ada = norm_ops.ada_values(temb, n)
        # One call for six views each (this forward runs on the host while the GPU works: a
        # view per index would cost more host time than the rest of the seams).
        shift_msa, scale_msa, _, shift_mlp, scale_mlp, _ = ada.unbind(2)
        rows = table.unbind(0)
        norm_h = dit_block_chain.take(module, h, temb)
        if norm_h is None:
            norm_h = norm_ops.adaln(h, scale_msa, shift_msa, w1, norm_eps(module.norm1, h),
                                    "rms", rows[1], rows[0])
        attn_out = module.attn1(hidden_states=norm_h, encoder_hidden_states=None,
                                image_rotary_emb=image_rotary_emb)
        # The gates as diffusers rounds them (table + temb in the model's dtype), both from one
        # add: [B, 1 or T, D] views of [B, 1 or T, 2, D].
        gate_msa, gate_mlp = (table[2::3] + ada[:, :, 2::3]).unbind(2)
        h = _residual(h, attn_out, gate_msa)
        attn_out = module.attn2(h, encoder_hidden_states=encoder_hidden_states, image_rotary_emb=None,
                                attention_mask=encoder_attention_mask)
        zero, one = constant(constants, h, lambda: (h.new_zeros(1, 1, d), h.new_ones(d)))
        if attn_out.shape != h.shape or not kiln_can_take(h, attn_out):
            h = h + attn_out
            norm_h = norm_ops.adaln(h, scale_mlp, shift_mlp, w2, norm_eps(module.norm2, h), "rms",
                                    rows[4], rows[3])
        else:
            h, norm_h = norm_ops.gated_adaln(h, attn_out, zero.expand(b, 1, d), scale_mlp, shift_mlp, w2,
                                             norm_eps(module.norm2, h), "rms", one, rows[4], rows[3])
        ff_out = module.ff(norm_h)
        if ff_out.shape == h.shape and kiln_can_take(h, ff_out, gate_mlp):
            nxt = dit_block_chain.successor(module, h, temb)
            if nxt is not None:
                handed = _hand_over(module, nxt, h, ff_out, gate_mlp, scale_msa, shift_msa, temb, zero[0, 0])
                if handed is not None:
                    return handed
            return activation_ops.gated_residual_(h, ff_out, gate_mlp)
        return h + ff_out * gate_mlp

    return forward


def _hand_over(module, nxt, h, ff_out, gate_mlp, scale, shift, temb, zero_row) -> Optional[torch.Tensor]:
    """``h + ff_out * gate_mlp`` and the next block's norm1 AdaLN of it in one pass (the
    AdaLN as that block would compute it from the same temb; the gate, already summed as
    diffusers rounds it, with a zero table row); the norm is handed over, the new h
    returned. None where the next block's parameters do not fit."""
    d = h.shape[-1]
    table = getattr(nxt, "scale_shift_table", None)
    norm = getattr(nxt, "norm1", None)
    weight = getattr(norm, "weight", None)
    weights = [weight] if isinstance(weight, torch.Tensor) else []
    if not isinstance(table, torch.Tensor) or table.shape != (6, d) or norm is None \
            or any(w.shape != (d,) for w in weights) or not kiln_can_take(h, table, *weights):
        return None
    h, norm_h = norm_ops.gated_adaln(h, ff_out, gate_mlp, scale, shift,
                                     weights[0] if weights else None, norm_eps(norm, h), "rms",
                                     zero_row, table[1], table[0])
    dit_block_chain.hand_over(module, nxt, h, temb, norm_h)
    return h
