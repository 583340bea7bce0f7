"""Wan's transformer block (diffusers' ``WanTransformerBlock``) with its seams fused.

diffusers computes each seam in fp32 from an fp32 ``scale_shift_table`` (its loader keeps it in
fp32) plus temb's rows, each elementwise step a kernel over the whole hidden state in fp32:

* ``norm1(h) * (1 + scale_msa) + shift_msa`` -> ``kiln.adaln``;
* ``h + attn1 * gate_msa`` then ``norm2(h)`` (its LayerNorm with weight and bias) -> one
  ``kiln.gated_adaln`` (the weight as a table scale row ``weight - 1``, the bias as a table
  shift row, the modulation operands zero);
* ``h + attn2`` then ``norm3(h) * (1 + c_scale_msa) + c_shift_msa`` -> one ``kiln.gated_adaln``
  (gate 0 + 1: the add is exact, as diffusers' add in h's dtype is);
* ``h + ff * c_gate_msa`` -> with the next block's norm1 AdaLN, one ``kiln.gated_adaln`` whose
  normalised output is handed over to that block (dit_block_chain.py); at the last block,
  diffusers' formula.

kiln reads the fp32 table rows beside temb's rows of h's dtype and adds them in fp32, as
diffusers does, and rounds each seam's outputs once, as diffusers' ``.type_as(h)`` does. The
attentions and the feed-forward are the module's own, called as diffusers calls them. Anything
else (autograd, other dtypes or shapes, a norm2 that is not a LayerNorm) runs diffusers'
forward.
"""

from typing import Callable, Optional

import torch

from .. import norm_ops
from . import dit_block_chain
from .forwards import kiln_can_take, norm_eps, recording_a_graph

BLOCK_OPS = "adaln + gated_adaln"


def _table_rows(table: torch.Tensor):
    """The six [D] rows of a [1, 6, D] scale_shift_table."""
    return table[0].unbind(0)


def _norm2_rows(module: torch.nn.Module, like: torch.Tensor, table: torch.Tensor, cache: dict):
    """norm2's weight and bias as table rows of the table's dtype: ``weight - 1`` (the kernel
    adds 1) and the bias, zeros where the norm has none. Kept while the parameters are
    unchanged; made afresh where a graph is recorded."""
    norm = module.norm2
    weight, bias = getattr(norm, "weight", None), getattr(norm, "bias", None)
    d = like.shape[-1]

    def make():
        scale = weight.to(table.dtype) - 1 if isinstance(weight, torch.Tensor) else table.new_zeros(d)
        shift = bias.to(table.dtype) if isinstance(bias, torch.Tensor) else table.new_zeros(d)
        return scale, shift

    if recording_a_graph(like):
        return make()
    # The parameters themselves are held and compared by identity (an id alone could be a
    # replaced parameter's, reused), with their version counters for in-place changes.
    params = (weight, bias)
    versions = tuple(t._version if isinstance(t, torch.Tensor) else None for t in params)
    held = cache.get("params")
    if held is None or any(a is not b for a, b in zip(held, params)) or cache["versions"] != versions \
            or cache["key"] != (d, table.dtype, like.device):
        cache.update(params=params, versions=versions, key=(d, table.dtype, like.device), rows=make())
    return cache["rows"]


def _constants(cache: dict, h: torch.Tensor, table: torch.Tensor):
    """A [B, 1, D] zero operand of h's dtype, a zero and a one row of the table's dtype."""
    b, d = h.shape[0], h.shape[-1]

    def make():
        return h.new_zeros(1, 1, d), table.new_zeros(d), table.new_ones(d)

    if recording_a_graph(h):
        zero, zero_row, one_row = make()
    else:
        key = (d, h.dtype, table.dtype, h.device)
        if cache.get("key") != key:
            cache["key"], cache["values"] = key, make()
        zero, zero_row, one_row = cache["values"]
    return zero.expand(b, 1, d), zero_row, one_row


def _operands(temb: torch.Tensor, h: torch.Tensor):
    """The six modulation operands of temb ([B, 6, D] per sample, [B, S, 6, D] per token) as
    [B, 1 or S, D] views, or None where temb has another shape."""
    b, s, d = h.shape
    if temb.dim() == 3 and temb.shape == (b, 6, d):
        return temb.unsqueeze(1).unbind(2)
    if temb.dim() == 4 and temb.shape == (b, s, 6, d):
        return temb.unbind(2)
    return None


def _fits(module: torch.nn.Module, h, temb) -> bool:
    table = module.scale_shift_table
    if not (isinstance(h, torch.Tensor) and isinstance(temb, torch.Tensor) and h.dim() == 3
            and isinstance(table, torch.Tensor) and table.shape == (1, 6, h.shape[-1])
            and table.device == h.device and table.dtype in (torch.float32, h.dtype)):
        return False
    norm2 = module.norm2
    params = [p for p in (getattr(norm2, "weight", None), getattr(norm2, "bias", None)) if p is not None]
    # norm1 and norm3 are LayerNorms without parameters (the probe checked), as Wan's are.
    plain = all(getattr(getattr(module, n), "weight", None) is None for n in ("norm1", "norm3"))
    return (plain and isinstance(norm2, torch.nn.LayerNorm) and all(p.shape == (h.shape[-1],) for p in params)
            and kiln_can_take(h, temb) and not (torch.is_grad_enabled() and any(p.requires_grad for p in params)))


def wan_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``WanTransformerBlock.forward`` with its seams fused (see the module's docstring)."""
    constants, norm2_rows = {}, {}

    # diffusers' own signature (the probe checked the names), so no argument binding runs
    # per call.
    def forward(hidden_states, encoder_hidden_states, temb, rotary_emb):
        h = hidden_states
        if not _fits(module, h, temb):
            return original(hidden_states, encoder_hidden_states, temb, rotary_emb)
        ops = _operands(temb, h)
        if ops is None:
            return original(hidden_states, encoder_hidden_states, temb, rotary_emb)
        shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = ops
        table = module.scale_shift_table
        rows = _table_rows(table)
        zero, zero_row, one_row = _constants(constants, h, table)

        norm_h = dit_block_chain.take(module, h, temb)
        if norm_h is None:
            norm_h = norm_ops.adaln(h, scale_msa, shift_msa, None, norm_eps(module.norm1, h), "layer",
                                    rows[1], rows[0])
        attn_out = module.attn1(norm_h, None, None, rotary_emb)
        w2, b2 = _norm2_rows(module, h, table, norm2_rows)
        if attn_out.shape != h.shape or not kiln_can_take(h, attn_out):
            return _rest_as_diffusers(module, h, attn_out, encoder_hidden_states, ops, table)
        h, norm_h = norm_ops.gated_adaln(h, attn_out, gate_msa, zero, zero, None, norm_eps(module.norm2, h),
                                         "layer", rows[2], w2, b2)
        attn_out = module.attn2(norm_h, encoder_hidden_states, None, None)
        if attn_out.shape != h.shape or not kiln_can_take(h, attn_out):
            h = h + attn_out
            norm_h = norm_ops.adaln(h, c_scale_msa, c_shift_msa, None, norm_eps(module.norm3, h), "layer",
                                    rows[4], rows[3])
        else:
            h, norm_h = norm_ops.gated_adaln(h, attn_out, zero, c_scale_msa, c_shift_msa, None,
                                             norm_eps(module.norm3, h), "layer", one_row, rows[4], rows[3])
        ff_out = module.ffn(norm_h)
        if ff_out.shape == h.shape and kiln_can_take(h, ff_out):
            nxt = dit_block_chain.successor(module)
            if nxt is not None:
                handed = _hand_over(module, nxt, h, ff_out, c_gate_msa, rows[5], ops, temb)
                if handed is not None:
                    return handed
        return (h.float() + ff_out.float() * (rows[5] + c_gate_msa.float())).type_as(h)

    return forward


def _rest_as_diffusers(module, h, attn_out, encoder_hidden_states, ops, table):
    """The block after attn1, as diffusers computes it (an attention output kiln cannot take)."""
    _, _, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = [
        table[0, i] + op.float() for i, op in enumerate(ops)]
    h = (h.float() + attn_out * gate_msa).type_as(h)
    norm_h = module.norm2(h.float()).type_as(h)
    h = h + module.attn2(norm_h, encoder_hidden_states, None, None)
    norm_h = (module.norm3(h.float()) * (1 + c_scale_msa) + c_shift_msa).type_as(h)
    ff_out = module.ffn(norm_h)
    return (h.float() + ff_out.float() * c_gate_msa).type_as(h)


def _hand_over(module, nxt, h, ff_out, c_gate_msa, gate_row, ops, temb) -> Optional[torch.Tensor]:
    """``h + ff_out * c_gate_msa`` and the next block's norm1 AdaLN of it in one pass (from
    the same temb, as that block would compute it); the normalised output is handed over and
    the new h returned. None where the next block's parameters do not fit."""
    table = getattr(nxt, "scale_shift_table", None)
    norm = getattr(nxt, "norm1", None)
    if not isinstance(table, torch.Tensor) or table.shape != module.scale_shift_table.shape \
            or table.dtype != gate_row.dtype or table.device != h.device or norm is None:
        return None
    rows = _table_rows(table)
    shift, scale = ops[0], ops[1]
    h, norm_h = norm_ops.gated_adaln(h, ff_out, c_gate_msa, scale, shift, None, norm_eps(norm, h), "layer",
                                     gate_row, rows[1], rows[0])
    dit_block_chain.hand_over(module, nxt, h, temb, norm_h)
    return h
