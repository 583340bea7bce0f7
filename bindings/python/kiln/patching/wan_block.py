"""Wan's transformer block (diffusers' ``WanTransformerBlock``, and SkyReels-V2's, which masks its
self-attention and may modulate each token from [B, 6, S, D] rows) with its seams fused.

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

kiln reads the table rows in fp32 (whatever the table's dtype) beside temb's rows of h's dtype
and adds them in fp32, as diffusers does, and rounds each seam's outputs once, as diffusers'
``.type_as(h)`` does. The attentions and the feed-forward are the module's own, called as
diffusers calls them. Anything else (autograd, other dtypes or shapes, a norm2 that is not a
LayerNorm, hooks on the norms) runs diffusers' forward.
"""

from typing import Callable, Optional

import torch

from .. import norm_ops
from . import dit_block_chain
from .forwards import any_hooks, kept_while_unchanged, kiln_can_take, norm_eps, records_parameters

BLOCK_OPS = "adaln + gated_adaln"


def _rows(module: torch.nn.Module, h: torch.Tensor, cache: dict):
    """The fp32 table rows the seams read: the scale_shift_table's six, norm2's weight - 1 (the
    kernel adds the 1 back) and bias (zeros where it has none), a zero and a one row. fp32
    whatever the table's and the weights' dtypes: diffusers adds its table to temb in fp32
    (``table + temb.float()``) and norm2 multiplies by its weight in fp32 (FP32LayerNorm), so
    a 16-bit table or weight is read exactly and nothing is rounded that diffusers keeps."""
    table = module.scale_shift_table
    norm = module.norm2
    weight, bias = getattr(norm, "weight", None), getattr(norm, "bias", None)
    d = h.shape[-1]

    def make():
        rows = table[0].float().unbind(0)
        scale = weight.float() - 1 if isinstance(weight, torch.Tensor) else rows[0].new_zeros(d)
        shift = bias.float() if isinstance(bias, torch.Tensor) else rows[0].new_zeros(d)
        return rows, scale, shift, rows[0].new_ones(d)

    return kept_while_unchanged(cache, "rows", (table, weight, bias), h, make)


def _zero_operand(h: torch.Tensor, cache: dict) -> torch.Tensor:
    """A [B, 1, D] zero modulation operand of h's dtype."""
    b, d = h.shape[0], h.shape[-1]
    return kept_while_unchanged(cache, "zero", (), h, lambda: h.new_zeros(1, 1, d)).expand(b, 1, d)


def _operands(temb: torch.Tensor, h: torch.Tensor, rows_first: bool):
    """The six modulation operands of temb ([B, 6, D] per sample; per token [B, S, 6, D], or
    [B, 6, S, D] where ``rows_first``: SkyReels-V2's diffusion forcing) as [B, 1 or S, D] views,
    or None where temb has another shape."""
    b, s, d = h.shape
    if temb.dim() == 3 and temb.shape == (b, 6, d):
        return temb.unsqueeze(1).unbind(2)
    if temb.dim() == 4 and temb.shape == ((b, 6, s, d) if rows_first else (b, s, 6, d)):
        return temb.unbind(1 if rows_first else 2)
    return None


def _fits(module: torch.nn.Module, h, temb) -> bool:
    """Whether the fused seams compute what the block does for these inputs: h [B, S, D] and
    temb of one kiln dtype and device, the table and norm2's parameters on that device (not
    left on the meta device by sequential offload), no hook on the norms (one may change their
    outputs or move their weights), and no autograd graph to record (gated_adaln has no
    backward, nor do fp32 table rows beside 16-bit rows)."""
    table = module.scale_shift_table
    if not (isinstance(h, torch.Tensor) and isinstance(temb, torch.Tensor) and h.dim() == 3
            and isinstance(table, torch.Tensor) and table.shape == (1, 6, h.shape[-1])
            and table.device == h.device and kiln_can_take(h, temb)):
        return False
    norms = (module.norm1, module.norm2, module.norm3)
    params = [p for p in (getattr(norms[1], "weight", None), getattr(norms[1], "bias", None)) if p is not None]
    # norm1 and norm3 are LayerNorms without parameters (the probe checked), as Wan's are.
    if any(getattr(n, "weight", None) is not None for n in (norms[0], norms[2])) \
            or not isinstance(norms[1], torch.nn.LayerNorm) or any(any_hooks(n) for n in norms) \
            or any(p.shape != (h.shape[-1],) or p.device != h.device for p in params):
        return False
    return not records_parameters(module)


def wan_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``WanTransformerBlock.forward`` with its seams fused (see the module's docstring)."""
    cache = {}

    # diffusers' own signature (the probe checked the names), so no argument binding runs
    # per call.
    def forward(hidden_states, encoder_hidden_states, temb, rotary_emb):
        ops = _fitting_operands(module, hidden_states, temb, rows_first=False)
        if ops is None:
            return original(hidden_states, encoder_hidden_states, temb, rotary_emb)
        return _fused(module, hidden_states, encoder_hidden_states, temb, rotary_emb, None, ops, cache)

    return forward


def skyreels_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``SkyReelsV2TransformerBlock.forward``: Wan's block whose self-attention takes a mask (the
    causal mask across frame blocks) and whose per-token modulation comes as [B, 6, S, D]."""
    cache = {}

    def forward(hidden_states, encoder_hidden_states, temb, rotary_emb, attention_mask):
        ops = _fitting_operands(module, hidden_states, temb, rows_first=True)
        if ops is None:
            return original(hidden_states, encoder_hidden_states, temb, rotary_emb, attention_mask)
        return _fused(module, hidden_states, encoder_hidden_states, temb, rotary_emb, attention_mask, ops, cache)

    return forward


def vace_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``WanVACETransformerBlock.forward``: Wan's block over the control stream (the first VACE
    block adds its input projection of the control to the video stream first), returning the
    stream's output projection (the hint the model adds to a main block's output) and the stream."""
    cache = {}

    def forward(hidden_states, encoder_hidden_states, control_hidden_states, temb, rotary_emb):
        c = control_hidden_states
        ops = _fitting_operands(module, c, temb, rows_first=False) if temb.dim() == 3 else None
        if ops is None or hidden_states.shape != c.shape:
            return original(hidden_states, encoder_hidden_states, control_hidden_states, temb, rotary_emb)
        if module.proj_in is not None:
            c = module.proj_in(c) + hidden_states
        c = _fused(module, c, encoder_hidden_states, temb, rotary_emb, None, ops, cache)
        return (module.proj_out(c) if module.proj_out is not None else None), c

    return forward


def _fitting_operands(module: torch.nn.Module, h, temb, rows_first: bool):
    """The six modulation operands (_operands) where kiln's seams compute the block for h and
    temb (_fits), else None."""
    return _operands(temb, h, rows_first) if _fits(module, h, temb) else None


def _fused(module: torch.nn.Module, h, encoder_hidden_states, temb, rotary_emb, mask, ops, cache) -> torch.Tensor:
    """The block on h with kiln's seams (``ops``: _fitting_operands'; ``mask``: the
    self-attention's)."""
    shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = ops
    rows, w2, b2, one_row = _rows(module, h, cache)
    zero = _zero_operand(h, cache)

    norm_h = dit_block_chain.take(module, h, temb)
    if norm_h is None:
        norm_h = norm_ops.adaln(h, scale_msa, shift_msa, None, norm_eps(module.norm1, h), "layer",
                                rows[1], rows[0])
    attn_out = module.attn1(norm_h, None, mask, rotary_emb)
    if attn_out.shape != h.shape or not kiln_can_take(h, attn_out):
        return _rest_as_diffusers(module, h, attn_out, encoder_hidden_states, ops)
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
        nxt = dit_block_chain.successor(module, h, temb)
        if nxt is not None:
            handed = _hand_over(module, nxt, h, ff_out, c_gate_msa, rows[5], ops, temb, cache)
            if handed is not None:
                return handed
    return (h.float() + ff_out.float() * (rows[5] + c_gate_msa.float())).type_as(h)


def _rest_as_diffusers(module, h, attn_out, encoder_hidden_states, ops):
    """The block after attn1, as diffusers computes it (an attention output kiln cannot take)."""
    table = module.scale_shift_table
    _, _, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = [table[0, i] + op.float() for i, op in enumerate(ops)]
    h = (h.float() + attn_out * gate_msa).type_as(h)
    norm_h = module.norm2(h.float()).type_as(h)
    h = h + module.attn2(norm_h, encoder_hidden_states, None, None)
    norm_h = (module.norm3(h.float()) * (1 + c_scale_msa) + c_shift_msa).type_as(h)
    ff_out = module.ffn(norm_h)
    return (h.float() + ff_out.float() * c_gate_msa).type_as(h)


def _hand_over(module, nxt, h, ff_out, c_gate_msa, gate_row, ops, temb, cache) -> Optional[torch.Tensor]:
    """``h + ff_out * c_gate_msa`` and the next block's norm1 AdaLN of it in one pass (from
    the same temb, as that block would compute it, its table rows in fp32); the normalised
    output is handed over and the new h returned. None where the next block's parameters do
    not fit."""
    table = getattr(nxt, "scale_shift_table", None)
    norm = getattr(nxt, "norm1", None)
    # The next block's table rows go into this block's gated_adaln, which has no backward:
    # where that table trains (a fine-tune of later blocks only), nothing is handed over.
    if not isinstance(table, torch.Tensor) or table.shape != module.scale_shift_table.shape \
            or table.device != h.device or norm is None \
            or (table.requires_grad and torch.is_grad_enabled()):
        return None
    rows = kept_while_unchanged(cache, "next", (table,), h, lambda: table[0].float().unbind(0))
    shift, scale = ops[0], ops[1]
    h, norm_h = norm_ops.gated_adaln(h, ff_out, c_gate_msa, scale, shift, None, norm_eps(norm, h), "layer",
                                     gate_row, rows[1], rows[0])
    dit_block_chain.hand_over(module, nxt, h, temb, norm_h)
    return h
