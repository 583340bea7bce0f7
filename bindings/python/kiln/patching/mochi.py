"""Mochi's transformer (diffusers' ``MochiTransformer3DModel``): its attention processor and its
blocks' seams.

The attention RMS-normalises each head of q and k, then rotates them by a table of angles per
token and head ([N, H, D/2] fp32: Mochi learns a frequency per head), interleaved pairs; diffusers
runs the rotation as about ten kernels with fp32 temporaries. Head h's pairs are pairs
h * D/2 .. (h + 1) * D/2 - 1 of the token's whole row, so the table read as one row of H * D/2
angles a token is a half table of a rotation spanning the row: one ``kiln.rope`` of q and k.
Each batch entry then attends over its video tokens and its valid text tokens; diffusers gathers
the text tokens by ``nonzero`` of the mask in every block (a host sync each) and concatenates,
pads and concatenates again. kiln's finds the valid tokens once a forward, slices them where they
are the first ones (the usual right-padded prompt) and writes each entry's output into one
buffer, the padded rows zero as diffusers' are.

The block's seams are diffusers' fp32 formulas over the whole hidden state, each step a kernel:

* ``norm1(h) * (1 + scale_msa)`` -> ``kiln.adaln`` (RMSNorm, the shift a zero operand);
* ``h + rms_norm(attn) * tanh(gate_msa)`` then ``rms_norm(h) * (1 + scale_mlp)`` -> a
  ``kiln.adaln`` of the attention output (scale ``tanh(gate_msa)`` plus a table row of -1, so
  the kernel's ``1 + scale`` is the gate) and one ``kiln.gated_adaln`` (gate 0 plus a table row
  of 1: the add exact, as diffusers' add in h's dtype is);
* ``h + rms_norm(ff) * tanh(gate_mlp)`` -> a ``kiln.adaln`` of the feed-forward's output, added.

Each output is rounded once to h's dtype where diffusers rounds it (after the gate's product).
The text stream's seams are the same (the last block's text takes its norm only). Anything else
(autograd, other dtypes, hooks on the norms, torch.compile tracing the attention, where Inductor
fuses diffusers' formulas itself) runs diffusers' forward.
"""

from typing import Callable

import torch
import torch.nn.functional as F

from .. import norm_ops, rope_ops
from .forwards import (any_hooks, kept_while_unchanged, kiln_can_take, norm_eps, recording_a_graph,
                       records_parameters, signature_kept)
from .per_forward import OncePerForward

BLOCK_OPS = "adaln + gated_adaln"


def _valid_tokens(attention_mask: torch.Tensor) -> list:
    """Each batch entry's valid text tokens: their count where they are the first ones, else the
    indices of all of them (a tensor on the mask's device)."""
    valid = attention_mask.bool()
    counts = valid.sum(1)
    prefix = (valid == (torch.arange(valid.shape[1], device=valid.device) < counts[:, None])).all(1)
    result = []
    for count, is_prefix, row in zip(counts.tolist(), prefix.tolist(), valid):
        result.append(count if is_prefix else torch.nonzero(row, as_tuple=False).flatten())
    return result


# Every block of a forward receives the same text mask: its valid tokens are found once.
_VALID_TOKENS = OncePerForward(lambda attention_mask: _valid_tokens(attention_mask))


@signature_kept
class MochiAttnProcessor:
    """diffusers' ``MochiAttnProcessor2_0.__call__`` with the rotation one kiln launch and the
    valid tokens found once a forward (see the module's docstring); the projections, the norms
    and the attention are diffusers'."""

    def __init__(self, original: object):
        self.original = original

    @staticmethod
    def _rotated(query: torch.Tensor, key: torch.Tensor, image_rotary_emb):
        """q and k [B, N, H, D] rotated by Mochi's [N, H, D/2] tables: one ``kiln.rope`` where it
        takes them, else diffusers' formula."""
        cos, sin = image_rotary_emb
        b, n, h, d = query.shape
        table_shape = (n, h, d // 2)
        if kiln_can_take(query, key, differentiable=True) and cos.shape == table_shape and sin.shape == table_shape \
                and cos.device == query.device and sin.device == query.device and cos.dtype == sin.dtype \
                and cos.dtype in (torch.float32, query.dtype) \
                and not (torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad)):
            q, k = rope_ops.rope(query.flatten(2), key.flatten(2), cos.reshape(n, -1), sin.reshape(n, -1),
                                 interleaved=True, rotary_dim=h * d, layout="bshd", head_dim=h * d)
            return q.unflatten(2, (h, d)), k.unflatten(2, (h, d))

        def rotate(x):
            x_even, x_odd = x[..., 0::2].float(), x[..., 1::2].float()
            first = (x_even * cos - x_odd * sin).to(x.dtype)
            second = (x_even * sin + x_odd * cos).to(x.dtype)
            return torch.stack([first, second], dim=-1).flatten(-2)

        return rotate(query), rotate(key)

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                 attention_mask: torch.Tensor, image_rotary_emb=None):
        if torch.compiler.is_compiling() or recording_a_graph(hidden_states) \
                or not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2 \
                or attention_mask.shape != encoder_hidden_states.shape[:2]:
            # diffusers' loop (nonzero of the mask) is what a trace or a capture records; a mask
            # of another shape is read as diffusers reads it.
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        heads = attn.heads
        query, key, value = (proj(hidden_states).unflatten(2, (heads, -1))
                             for proj in (attn.to_q, attn.to_k, attn.to_v))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        text = [proj(encoder_hidden_states).unflatten(2, (heads, -1))
                for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)]
        if attn.norm_added_q is not None:
            text[0] = attn.norm_added_q(text[0])
        if attn.norm_added_k is not None:
            text[1] = attn.norm_added_k(text[1])
        if image_rotary_emb is not None:
            query, key = self._rotated(query, key, image_rotary_emb)
        video, text_tokens = query.shape[1], text[0].shape[1]
        query, key, value = (torch.cat([a, b], dim=1) for a, b in zip((query, key, value), text))
        out = query.new_empty(query.shape[0], video + text_tokens, heads, query.shape[-1])
        for entry, valid in enumerate(_VALID_TOKENS.get(attention_mask)):
            if isinstance(valid, int):
                q, k, v = (t[entry:entry + 1, :video + valid] for t in (query, key, value))
            else:
                index = torch.cat([torch.arange(video, device=query.device), video + valid.to(query.device)])
                q, k, v = (t[entry:entry + 1].index_select(1, index) for t in (query, key, value))
            rows = q.shape[1]
            out[entry, :rows] = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                               v.transpose(1, 2), dropout_p=0.0,
                                                               is_causal=False)[0].transpose(0, 1)
            out[entry, rows:] = 0
        out = out.flatten(2, 3)
        hidden_states, encoder_hidden_states = out[:, :video], out[:, video:]
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        if hasattr(attn, "to_add_out"):
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states


# ---- the block -------------------------------------------------------------------------------


def _rows(cache: dict, stream: str, like: torch.Tensor):
    """The fp32 table rows the seams add to their operands (-1: a gate read as a scale, 0, 1) and
    a [B, 1, D] zero operand of the stream's dtype, kept per stream."""
    d = like.shape[-1]

    def make():
        zero = torch.zeros(d, dtype=torch.float32, device=like.device)
        return zero - 1, zero, zero + 1, like.new_zeros(1, 1, d)

    rows = kept_while_unchanged(cache, stream, (), like, make)
    return rows[:3] + (rows[3].expand(like.shape[0], 1, d),)


def _plain_rms_norm(norm: torch.nn.Module) -> bool:
    """A Mochi modulated norm (or RMSNorm-zero) whose RMSNorm has no weight and no hook (the
    classifier's probe checked that it computes one)."""
    inner = getattr(norm, "norm", None)
    return isinstance(inner, torch.nn.Module) and getattr(inner, "weight", None) is None \
        and not any_hooks(norm) and not any_hooks(inner)


def _context_norms(module: torch.nn.Module) -> list:
    if module.context_pre_only:  # norm1_context is the continuous norm of a modulated one
        return [module.norm1_context.norm]
    return [module.norm1_context, module.norm2_context, module.norm3_context, module.norm4_context]


def _fits(module: torch.nn.Module, h, c, temb) -> bool:
    if not (isinstance(h, torch.Tensor) and isinstance(c, torch.Tensor) and isinstance(temb, torch.Tensor)
            and h.dim() == 3 and c.dim() == 3 and temb.dim() == 2 and kiln_can_take(h, c, temb)):
        return False
    norms = [module.norm1, module.norm2, module.norm3, module.norm4] + _context_norms(module)
    return all(_plain_rms_norm(n) for n in norms) and not any_hooks(module.norm1_context) \
        and not records_parameters(module)


def _gated_norm(y: torch.Tensor, gate: torch.Tensor, norm: torch.nn.Module, rows) -> torch.Tensor:
    """Mochi's ``norm(y, tanh(gate))``: ``rms_norm(y) * tanh(gate)``, rounded once to y's dtype."""
    minus_one, zero, _, zero_operand = rows
    return norm_ops.adaln(y, torch.tanh(gate)[:, None], zero_operand, None, norm_eps(norm.norm, y), "rms", minus_one,
                          zero)


def _stream(norms, ff: torch.nn.Module, h: torch.Tensor, attn: torch.Tensor, gate_msa, scale_mlp, gate_mlp,
            rows) -> torch.Tensor:
    """One stream of the block after its attention: ``h + norm2(attn, tanh(gate_msa))``, norm3
    modulated by ``scale_mlp``, the feed-forward, ``+ norm4(ff, tanh(gate_mlp))``."""
    norm2, norm3, norm4 = norms
    if attn.shape != h.shape or not kiln_can_take(h, attn):
        h = h + norm2(attn, torch.tanh(gate_msa).unsqueeze(1))
        norm_h = norm3(h, (1 + scale_mlp.unsqueeze(1).to(torch.float32)))
    else:
        _, zero, one, zero_operand = rows
        y = _gated_norm(attn, gate_msa, norm2, rows)
        h, norm_h = norm_ops.gated_adaln(h, y, zero_operand, scale_mlp[:, None], zero_operand, None,
                                         norm_eps(norm3.norm, h), "rms", one, zero, zero)
    ff_out = ff(norm_h)
    if ff_out.shape != h.shape or not kiln_can_take(h, ff_out):
        return h + norm4(ff_out, torch.tanh(gate_mlp).unsqueeze(1))
    return h + _gated_norm(ff_out, gate_mlp, norm4, rows)


def _modulated(norm: torch.nn.Module, x: torch.Tensor, scale: torch.Tensor, rows) -> torch.Tensor:
    """``rms_norm(x) * (1 + scale)`` rounded to x's dtype (Mochi's RMSNorm-zero and modulated norm)."""
    _, _, _, zero_operand = rows
    return norm_ops.adaln(x, scale[:, None], zero_operand, None, norm_eps(norm, x), "rms")


def mochi_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``MochiTransformerBlock.forward`` with its seams fused (see the module's docstring)."""
    cache = {}

    def forward(hidden_states, encoder_hidden_states, temb, encoder_attention_mask, image_rotary_emb=None):
        h, c = hidden_states, encoder_hidden_states
        if not _fits(module, h, c, temb):
            return original(hidden_states, encoder_hidden_states, temb, encoder_attention_mask, image_rotary_emb)
        h_rows, c_rows = _rows(cache, "video", h), _rows(cache, "text", c)
        norm1 = module.norm1
        scale_msa, gate_msa, scale_mlp, gate_mlp = norm1.linear(norm1.silu(temb)).chunk(4, dim=1)
        norm_h = _modulated(norm1.norm, h, scale_msa, h_rows)
        context = module.norm1_context
        if module.context_pre_only:
            scale = context.linear_1(context.silu(temb).to(c.dtype))
            norm_c = _modulated(context.norm.norm, c, scale, c_rows)
        else:
            c_scale_msa, *text = context.linear(context.silu(temb)).chunk(4, dim=1)
            norm_c = _modulated(context.norm, c, c_scale_msa, c_rows)
        attn, c_attn = module.attn1(hidden_states=norm_h, encoder_hidden_states=norm_c,
                                    image_rotary_emb=image_rotary_emb, attention_mask=encoder_attention_mask)
        h = _stream((module.norm2, module.norm3, module.norm4), module.ff, h, attn, gate_msa, scale_mlp, gate_mlp,
                    h_rows)
        if not module.context_pre_only:
            c = _stream((module.norm2_context, module.norm3_context, module.norm4_context), module.ff_context, c,
                        c_attn, *text, c_rows)
        return h, c

    return forward
