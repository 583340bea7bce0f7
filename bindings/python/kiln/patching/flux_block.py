"""FLUX's transformer blocks (diffusers' ``FluxTransformerBlock`` and
``FluxSingleTransformerBlock``) with the elementwise work between their matmuls fused.

diffusers runs each seam as separate 16-bit kernels over the whole hidden state; kiln:

* double-stream block, each stream: ``h + gate_msa * attn`` then ``norm2(h) * (1 + scale_mlp)
  + shift_mlp`` -> one ``kiln.gated_adaln`` (norm2 a LayerNorm without parameters); then
  ``h + gate_mlp * ff`` -> one ``kiln.gated_residual_`` into that new h;
* single-stream block: the attention output and the MLP's activation are written side by side
  into the buffer ``proj_out`` reads (``kiln.gelu(..., out=buffer[..., d:])``, or
  ``kiln.swiglu`` where the MLP is gated as Ovis-Image's: ``proj_mlp`` gives up and gate side by
  side), where diffusers activates into a tensor of its own and concatenates the two;
  ``residual + gate * proj_out``
  -> one ``kiln.gated_residual``; and the text and image streams a block receives as two
  adjacent slices of the previous block's output are read as that output, not concatenated
  again.

The FLUX copies in diffusers (Bria's, LongCat-Image's, Ovis-Image's, Bria FIBO's blocks) take the
same forwards, some with their attention's keyword arguments named ``attention_kwargs``, Bria
FIBO's single block with the two streams already joined (:func:`joined_single_block`).

Each seam is rounded once to h's dtype where diffusers rounds after each product and sum.
The attention, norm1 and feed-forward modules are the block's own (patched where kiln.patch
patched them). Anything else (autograd, a norm2 with parameters or hooks, IP-adapter inputs,
an MLP activation other than ``nn.GELU`` or the gated ``nn.SiLU``, torch.compile tracing the
single block, where Inductor fuses the concatenation itself) runs diffusers' forward.
"""

import inspect
from typing import Callable, Optional

import torch

from .. import activation_ops, norm_ops
from .forwards import any_hooks, kiln_can_take, norm_eps, records_parameters

DOUBLE_OPS = "gated_adaln + gated_residual"
# diffusers clips 16-bit streams to fp16's range after each block.
_FP16_MAX = 65504


def plain_layer_norm(norm: torch.nn.Module, width: int) -> bool:
    return type(norm) is torch.nn.LayerNorm and norm.weight is None and norm.bias is None \
        and tuple(norm.normalized_shape) == (width,) and not any_hooks(norm)


def fits_double(module: torch.nn.Module, h, c, temb, joint_attention_kwargs) -> bool:
    if not (isinstance(h, torch.Tensor) and isinstance(c, torch.Tensor) and isinstance(temb, torch.Tensor)
            and h.dim() == 3 and c.dim() == 3 and kiln_can_take(h, c)):
        return False
    if joint_attention_kwargs and any(k.startswith("ip_") for k in joint_attention_kwargs):
        return False
    d = h.shape[-1]
    return plain_layer_norm(module.norm2, d) and plain_layer_norm(module.norm2_context, d) \
        and not records_parameters(module)


def _kiln_stream(norm, ff, h, attn, gate_msa, shift_mlp, scale_mlp, gate_mlp) -> Optional[torch.Tensor]:
    """One stream of the double block after its attention: None where the attention's output
    is not of h's shape and kind (the caller then computes it as diffusers does)."""
    if attn.shape != h.shape or not kiln_can_take(h, attn, gate_msa, scale_mlp, shift_mlp, gate_mlp):
        return None
    h, norm_h = norm_ops.gated_adaln(h, attn, gate_msa[:, None], scale_mlp[:, None], shift_mlp[:, None], None,
                                     norm_eps(norm, h), "layer")
    ff_out = ff(norm_h)
    if ff_out.shape != h.shape or not kiln_can_take(h, ff_out):
        return h + gate_mlp[:, None] * ff_out
    return activation_ops.gated_residual_(h, ff_out, gate_mlp[:, None])


def _stream_as_diffusers(norm, ff, h, attn, gate_msa, shift_mlp, scale_mlp, gate_mlp) -> torch.Tensor:
    h = h + gate_msa.unsqueeze(1) * attn
    norm_h = norm(h) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
    return h + gate_mlp.unsqueeze(1) * ff(norm_h)


def double_stream(norm, ff, h, attn, gate_msa, shift_mlp, scale_mlp, gate_mlp) -> torch.Tensor:
    """One stream of a FLUX-like double block after its attention (``h + gate_msa * attn``, the
    modulated norm2, ``+ gate_mlp * ff``): kiln's seams where they take the tensors, else as
    diffusers computes it."""
    new_h = _kiln_stream(norm, ff, h, attn, gate_msa, shift_mlp, scale_mlp, gate_mlp)
    if new_h is None:
        new_h = _stream_as_diffusers(norm, ff, h, attn, gate_msa, shift_mlp, scale_mlp, gate_mlp)
    return new_h


# What diffusers' FLUX-like blocks call their attention's keyword arguments: FLUX's name, Bria's.
KWARGS_NAMES = ("joint_attention_kwargs", "attention_kwargs")


def kwargs_name(original: Callable) -> str:
    """The name of the last argument of a FLUX-like block's forward (its attention's keyword
    arguments)."""
    return tuple(inspect.signature(original).parameters)[-1]


def _taking(forward: Callable, name: str) -> Callable:
    """A two-stream block's ``forward``, its last argument called ``name`` (callers pass it by
    keyword: Bria's transformer passes ``attention_kwargs=``)."""
    if name == "joint_attention_kwargs":
        return forward

    def renamed(hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, attention_kwargs=None):
        return forward(hidden_states, encoder_hidden_states, temb, image_rotary_emb, attention_kwargs)

    return renamed


def flux_double_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``FluxTransformerBlock.forward`` with its seams fused (see the module's docstring)."""

    def forward(hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, joint_attention_kwargs=None):
        h, c = hidden_states, encoder_hidden_states
        if not fits_double(module, h, c, temb, joint_attention_kwargs):
            return original(hidden_states, encoder_hidden_states, temb, image_rotary_emb, joint_attention_kwargs)
        norm_h, *image = module.norm1(h, emb=temb)
        norm_c, *text = module.norm1_context(c, emb=temb)
        outputs = module.attn(hidden_states=norm_h, encoder_hidden_states=norm_c, image_rotary_emb=image_rotary_emb,
                              **(joint_attention_kwargs or {}))
        attn, c_attn = outputs[0], outputs[1]
        new_h = double_stream(module.norm2, module.ff, h, attn, *image)
        new_c = double_stream(module.norm2_context, module.ff_context, c, c_attn, *text)
        if len(outputs) == 3:
            new_h = new_h + outputs[2]
        if new_c.dtype == torch.float16:
            new_c = new_c.clip(-_FP16_MAX, _FP16_MAX)
        return new_c, new_h

    return _taking(forward, kwargs_name(original))


def joined(c: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``torch.cat([c, h], dim=1)``; without a copy where c and h are the two halves, in that
    order, of one contiguous tensor (the previous single block's output, split): that tensor
    holds exactly what the concatenation would. Traced by torch.compile, the concatenation
    (Dynamo does not trace data pointers)."""
    base = c._base
    if torch.compiler.is_compiling() or base is None or h._base is not base or base.dim() != 3 or not base.is_contiguous() \
            or base.shape[1] != c.shape[1] + h.shape[1] or c.stride() != base.stride() \
            or h.stride() != base.stride() or c.shape[::2] != base.shape[::2] or h.shape[::2] != base.shape[::2] \
            or c.data_ptr() != base.data_ptr() \
            or h.data_ptr() != base.data_ptr() + c.shape[1] * base.stride(1) * base.element_size():
        return torch.cat([c, h], dim=1)
    return base


def mlp_activation(module: torch.nn.Module) -> Optional[str]:
    """How a single block activates its ``proj_mlp`` output: "gelu" (FLUX's ``nn.GELU``),
    "swiglu" (Ovis-Image's ``nn.SiLU`` of the second half times the first, ``proj_mlp`` twice
    ``mlp_hidden_dim`` wide), else None."""
    act = module.act_mlp
    if type(act) is torch.nn.GELU and act.approximate in ("tanh", "none"):
        return "gelu"
    width = getattr(module, "mlp_hidden_dim", None)
    if type(act) is torch.nn.SiLU and isinstance(width, int) \
            and getattr(module.proj_mlp, "out_features", None) == 2 * width:
        return "swiglu"
    return None


def fits_single(module: torch.nn.Module, h, c, temb, joint_attention_kwargs) -> bool:
    if torch.compiler.is_compiling():
        return False
    if not (isinstance(h, torch.Tensor) and isinstance(c, torch.Tensor) and isinstance(temb, torch.Tensor)
            and h.dim() == 3 and c.dim() == 3 and h.shape[::2] == c.shape[::2] and kiln_can_take(h, c)):
        return False
    if mlp_activation(module) is None or any_hooks(module.act_mlp):
        return False
    return not joint_attention_kwargs and not records_parameters(module)


def _activated_as_diffusers(module: torch.nn.Module, mlp: torch.Tensor, gated: bool) -> torch.Tensor:
    if gated:
        up, gate = mlp.chunk(2, dim=-1)
        return module.act_mlp(gate) * up
    return module.act_mlp(mlp)


def _activate_into(module: torch.nn.Module, mlp: torch.Tensor, gated: bool, out: torch.Tensor) -> None:
    if gated:
        activation_ops.swiglu(mlp, None, up_first=True, out=out)
    else:
        activation_ops.gelu(mlp, None, module.act_mlp.approximate, out=out)


def single_output(module: torch.nn.Module, x: torch.Tensor, attn: torch.Tensor, mlp: torch.Tensor,
                  gate: torch.Tensor) -> torch.Tensor:
    """``x + gate * proj_out(cat([attn, act_mlp(mlp)], -1))`` for a single-stream block's joined
    stream x [B, N, D]: the activation written beside the attention's output into the buffer
    proj_out reads, the gated residual one kiln call; as written where kiln does not take them."""
    gated = mlp_activation(module) == "swiglu"
    if attn.shape[:2] != x.shape[:2] or mlp.shape[:2] != x.shape[:2] or not kiln_can_take(x, attn, mlp, gate):
        both = torch.cat([attn, _activated_as_diffusers(module, mlp, gated)], dim=2)
    else:
        d = attn.shape[-1]
        both = x.new_empty(*x.shape[:2], d + (mlp.shape[-1] // 2 if gated else mlp.shape[-1]))
        both[..., :d].copy_(attn)
        _activate_into(module, mlp, gated, both[..., d:])
    out = module.proj_out(both)
    if out.shape == x.shape and kiln_can_take(x, out, gate):
        return activation_ops.gated_residual(x, out, gate[:, None])
    return x + gate.unsqueeze(1) * out


def single_stream(module: torch.nn.Module, x: torch.Tensor, temb: torch.Tensor, **attention) -> torch.Tensor:
    """A FLUX-form single block's joined stream x [B, N, D] after it: its norm, MLP projection and
    attention (called with ``attention``), then :func:`single_output`; clipped to fp16's range
    as diffusers clips it."""
    norm_x, gate = module.norm(x, emb=temb)
    mlp = module.proj_mlp(norm_x)
    attn = module.attn(hidden_states=norm_x, **attention)
    x = single_output(module, x, attn, mlp, gate)
    if x.dtype == torch.float16:
        x = x.clip(-_FP16_MAX, _FP16_MAX)
    return x


def flux_single_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``FluxSingleTransformerBlock.forward`` with its concatenations and gated residual fused
    (see the module's docstring)."""

    def forward(hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, joint_attention_kwargs=None):
        h, c = hidden_states, encoder_hidden_states
        if not fits_single(module, h, c, temb, joint_attention_kwargs):
            return original(hidden_states, encoder_hidden_states, temb, image_rotary_emb, joint_attention_kwargs)
        x = single_stream(module, joined(c, h), temb, image_rotary_emb=image_rotary_emb)
        return x[:, :c.shape[1]], x[:, c.shape[1]:]

    return _taking(forward, kwargs_name(original))


def joined_single_block(module: torch.nn.Module, original: Callable) -> Callable:
    """A single block that receives and returns the joined stream (Bria FIBO's: ``forward(
    hidden_states, temb, image_rotary_emb, joint_attention_kwargs)``), fused as
    :func:`flux_single_block`."""

    def forward(hidden_states, temb, image_rotary_emb=None, joint_attention_kwargs=None):
        x = hidden_states
        if not fits_single(module, x, x, temb, joint_attention_kwargs):
            return original(hidden_states, temb, image_rotary_emb, joint_attention_kwargs)
        return single_stream(module, x, temb, image_rotary_emb=image_rotary_emb)

    return forward
