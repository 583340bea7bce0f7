"""FLUX.2's transformer (diffusers' ``Flux2Transformer2DModel``) with the elementwise work between
its matmuls fused. Its double-stream attention is FLUX.1's (:class:`.flux.FluxAttnProcessor`);
here are its blocks and its single blocks' parallel attention.

* double-stream block (``Flux2TransformerBlock``), each stream, from the model's shared
  modulation (``Flux2Modulation``'s chunks, read in place): norm1 and ``(1 + scale) * x +
  shift`` -> one ``kiln.adaln``; ``h + gate_msa * attn`` then norm2 and its modulation -> one
  ``kiln.gated_adaln``; ``h + gate_mlp * ff`` -> one ``kiln.gated_residual_`` into that new h;
* single-stream block (``Flux2SingleTransformerBlock``): its norm and modulation -> one
  ``kiln.adaln``; ``x + gate * attn`` -> one ``kiln.gated_residual``;
* the single blocks' parallel attention (``Flux2ParallelSelfAttnProcessor``): q and k, column
  slices of the fused projection, normalised per head and rotated in one ``kiln.head_norm_rope``
  (with autograd: the norm modules and one ``kiln.rope``), and the MLP's SwiGLU written into the
  buffer ``to_out`` reads beside the attention's output (``kiln.swiglu(..., out=)``), where
  diffusers activates into a tensor of its own and concatenates.

Each seam is rounded once to h's dtype where diffusers rounds after each product and sum. The
attentions and feed-forwards are the blocks' own modules (patched where kiln.patch patched them).
Anything else (autograd, norms with parameters or hooks, modulations of another shape, KV-cache
arguments, torch.compile's tracing of the blocks, where Inductor fuses the seams itself) runs
diffusers' forward.
"""

import sys
from typing import Callable, Optional

import torch

from .. import activation_ops, norm_ops, rope_ops
from .flux import FluxAttnProcessor
from .flux_block import plain_layer_norm
from .forwards import (SharedAttentionSettings, any_hooks, fused_head_norms, kiln_can_take, norm_eps,
                       records_parameters, signature_kept)

DOUBLE_OPS = "adaln + gated_adaln + gated_residual"
SINGLE_OPS = "adaln + gated_residual"
_FP16_MAX = 65504


def _chunks(mod: torch.Tensor, sets: int):
    """``Flux2Modulation.split``: ``3 * sets`` chunks of the last dimension, [B, 1, D] from a
    [B, 3 * sets * D] embedding."""
    if mod.dim() == 2:
        mod = mod.unsqueeze(1)
    return mod.chunk(3 * sets, dim=-1)


def _fits(x: torch.Tensor, *modulation: torch.Tensor) -> bool:
    """Each chunk per sample ([B, 1, D]) or per token ([B, T, D]) of x [B, T, D]."""
    return all(m.dim() == 3 and m.shape[0] == x.shape[0] and m.shape[1] in (1, x.shape[1]) and m.shape[2] == x.shape[2]
               for m in modulation) and kiln_can_take(x, *modulation)


def _blocks_run_kiln(module: torch.nn.Module, joint_attention_kwargs) -> bool:
    return not torch.compiler.is_compiling() and not joint_attention_kwargs and not records_parameters(module)


def flux2_double_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``Flux2TransformerBlock.forward`` with its seams fused (see the module's docstring)."""

    def forward(hidden_states, encoder_hidden_states, temb_mod_img, temb_mod_txt, image_rotary_emb=None,
                joint_attention_kwargs=None):
        h, c = hidden_states, encoder_hidden_states
        fits = _blocks_run_kiln(module, joint_attention_kwargs) and all(
            isinstance(t, torch.Tensor) for t in (h, c, temb_mod_img, temb_mod_txt)) and h.dim() == 3 and c.dim() == 3
        if fits:
            image, text = _chunks(temb_mod_img, 2), _chunks(temb_mod_txt, 2)
            d = h.shape[-1]
            fits = _fits(h, *image) and _fits(c, *text) and all(
                plain_layer_norm(getattr(module, name), d) for name in ("norm1", "norm1_context", "norm2",
                                                                         "norm2_context"))
        if not fits:
            return original(hidden_states, encoder_hidden_states, temb_mod_img, temb_mod_txt, image_rotary_emb,
                            joint_attention_kwargs)
        shift, scale, gate, shift_mlp, scale_mlp, gate_mlp = image
        c_shift, c_scale, c_gate, c_shift_mlp, c_scale_mlp, c_gate_mlp = text
        norm_h = norm_ops.adaln(h, scale, shift, None, norm_eps(module.norm1, h), "layer")
        norm_c = norm_ops.adaln(c, c_scale, c_shift, None, norm_eps(module.norm1_context, c), "layer")
        attn, c_attn = module.attn(hidden_states=norm_h, encoder_hidden_states=norm_c,
                                   image_rotary_emb=image_rotary_emb)
        h = _after_attention(module.norm2, module.ff, h, attn, gate, shift_mlp, scale_mlp, gate_mlp)
        c = _after_attention(module.norm2_context, module.ff_context, c, c_attn, c_gate, c_shift_mlp, c_scale_mlp,
                             c_gate_mlp)
        if c.dtype == torch.float16:
            c = c.clip(-_FP16_MAX, _FP16_MAX)
        return c, h

    return forward


def _after_attention(norm2, ff, h, attn, gate, shift_mlp, scale_mlp, gate_mlp) -> torch.Tensor:
    """One stream after its attention: the gated residual with norm2's modulation, the
    feed-forward and its gated residual."""
    if attn.shape != h.shape or not kiln_can_take(h, attn):
        h = h + gate * attn
        return h + gate_mlp * ff(norm2(h) * (1 + scale_mlp) + shift_mlp)
    h, norm_h = norm_ops.gated_adaln(h, attn, gate, scale_mlp, shift_mlp, None, norm_eps(norm2, h), "layer")
    y = ff(norm_h)
    if y.shape != h.shape or not kiln_can_take(h, y):
        return h + gate_mlp * y
    return activation_ops.gated_residual_(h, y, gate_mlp)


def flux2_single_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``Flux2SingleTransformerBlock.forward`` with its modulated norm and gated residual fused
    (see the module's docstring)."""

    def forward(hidden_states, encoder_hidden_states, temb_mod, image_rotary_emb=None, joint_attention_kwargs=None,
                split_hidden_states=False, text_seq_len=None):
        x = hidden_states
        fits = _blocks_run_kiln(module, joint_attention_kwargs) and isinstance(x, torch.Tensor) and x.dim() == 3 \
            and isinstance(temb_mod, torch.Tensor) and plain_layer_norm(module.norm, x.shape[-1])
        if fits and encoder_hidden_states is not None:
            fits = isinstance(encoder_hidden_states, torch.Tensor) and encoder_hidden_states.shape[::2] == x.shape[::2]
        if fits:
            if encoder_hidden_states is not None:
                text_seq_len = encoder_hidden_states.shape[1]
                x = torch.cat([encoder_hidden_states, x], dim=1)
            shift, scale, gate = _chunks(temb_mod, 1)
            fits = _fits(x, shift, scale, gate)
        if not fits:
            return original(hidden_states, encoder_hidden_states, temb_mod, image_rotary_emb, joint_attention_kwargs,
                            split_hidden_states, text_seq_len)
        norm_x = norm_ops.adaln(x, scale, shift, None, norm_eps(module.norm, x), "layer")
        attn = module.attn(hidden_states=norm_x, image_rotary_emb=image_rotary_emb)
        if attn.shape == x.shape and kiln_can_take(x, attn):
            x = activation_ops.gated_residual(x, attn, gate)
        else:
            x = x + gate * attn
        if x.dtype == torch.float16:
            x = x.clip(-_FP16_MAX, _FP16_MAX)
        if split_hidden_states:
            return x[:, :text_seq_len], x[:, text_seq_len:]
        return x

    return forward


@signature_kept
class Flux2ParallelAttnProcessor(SharedAttentionSettings):
    """diffusers' ``Flux2ParallelSelfAttnProcessor.__call__`` with q and k normalised and rotated
    in one ``kiln.head_norm_rope`` (``fuse_norms``) or rotated in one ``kiln.rope``, and the MLP's
    gate written beside the attention's output (see the module's docstring)."""

    def __init__(self, original: object, fuse_norms: bool = False):
        self.original = original
        # The module's q/k norms are RMSNorms one kiln call computes (checked when patched).
        self.fuse_norms = fuse_norms
        module = sys.modules[type(original).__module__]
        self._apply_rotary_emb = module.apply_rotary_emb
        self._dispatch = module.dispatch_attention_fn

    def _norms_and_rotation(self, attn, query, key, image_rotary_emb):
        table = FluxAttnProcessor._table(query, key, image_rotary_emb) if image_rotary_emb is not None else None
        norms = fused_head_norms((attn.norm_q, attn.norm_k), query, key) if self.fuse_norms else None
        if norms is not None and table is not None \
                and not (torch.is_grad_enabled() and any(t.requires_grad for t in table)):
            (wq, wk), eps = norms
            return rope_ops.head_norm_rope(query, key, wq, wk, *table, eps, interleaved=True, layout="bshd")
        query, key = attn.norm_q(query), attn.norm_k(key)
        if image_rotary_emb is None:
            return query, key
        table = FluxAttnProcessor._table(query, key, image_rotary_emb)
        if table is not None and kiln_can_take(query, key, differentiable=True):
            return rope_ops.rope(query, key, *table, interleaved=True, layout="bshd")
        return (self._apply_rotary_emb(query, image_rotary_emb, sequence_dim=1),
                self._apply_rotary_emb(key, image_rotary_emb, sequence_dim=1))

    @staticmethod
    def _joined(attn, out: torch.Tensor, mlp: torch.Tensor) -> torch.Tensor:
        """``torch.cat([out, attn.mlp_act_fn(mlp)], dim=-1)``; where the activation is FLUX.2's
        (SiLU of the first half times the second, unhooked), its one kiln.swiglu writes into the
        joined buffer itself (not while torch.compile traces: Dynamo takes no strided ``out=``, and
        Inductor fuses the concatenation itself)."""
        act = attn.mlp_act_fn
        if torch.compiler.is_compiling() or type(act).__name__ != "Flux2SwiGLU" or type(getattr(act, "gate_fn", None)) is not torch.nn.SiLU \
                or any_hooks(act) or mlp.shape[-1] % 2 or mlp.shape[:-1] != out.shape[:-1] \
                or not kiln_can_take(out, mlp):
            return torch.cat([out, act(mlp)], dim=-1)
        d = out.shape[-1]
        joined = out.new_empty(*out.shape[:-1], d + mlp.shape[-1] // 2)
        joined[..., :d].copy_(out)
        activation_ops.swiglu(mlp, None, False, out=joined[..., d:])
        return joined

    def __call__(self, attn, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                 image_rotary_emb=None) -> torch.Tensor:
        hidden_states = attn.to_qkv_mlp_proj(hidden_states)
        qkv_dim = 3 * attn.inner_dim
        mlp_dim = attn.mlp_hidden_dim * attn.mlp_mult_factor
        local_qkv = hidden_states.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
        qkv, mlp = torch.split(hidden_states, [local_qkv, hidden_states.shape[-1] - local_qkv], dim=-1)
        query, key, value = (t.unflatten(-1, (-1, attn.head_dim)) for t in qkv.chunk(3, dim=-1))
        query, key = self._norms_and_rotation(attn, query, key, image_rotary_emb)
        out = self._dispatch(query, key, value, attn_mask=attention_mask, backend=self._attention_backend,
                             parallel_config=self._parallel_config)
        out = out.flatten(2, 3).to(query.dtype)
        return attn.to_out(self._joined(attn, out, mlp))
