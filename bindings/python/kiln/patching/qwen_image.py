"""Qwen-Image's transformer (diffusers' ``QwenImageTransformer2DModel``: Qwen-Image,
Qwen-Image-Edit and the models built on its blocks): its attention processor and its blocks'
seams.

The attention normalises each head of q and k (RMSNorms with weights, the image's and the
text's their own) and rotates them by complex frequencies (``apply_rotary_emb_qwen`` with
``use_real=False``: adjacent pairs times one complex64 angle a pair, in fp32). diffusers runs
each of the four as about ten kernels with fp32 temporaries; kiln rotates by the angles' real
and imaginary parts as half tables (made contiguous once a forward for all the blocks), and
where the norms are RMSNorms kiln computes and no graph is recorded, normalises and rotates
each stream's q and k in one ``kiln.head_norm_rope_`` in place on the joint attention's
concatenation (a new tensor); otherwise the norm modules and one ``kiln.rope`` a stream.

The block (image and text streams, a modulation embedding each of six [B, D] chunks):

* norm1's LayerNorm and ``x * (1 + scale) + shift`` -> one ``kiln.adaln``;
* ``h + gate * attn`` then norm2 and its modulation -> one ``kiln.gated_adaln``;
* ``h + gate * mlp`` -> one ``kiln.gated_residual_`` into that new h.

Qwen-Image-Edit's per-token modulation (``modulate_index``: each image token takes the first
or the second half of the batch's embeddings) is selected as diffusers selects it and read
per token. Each seam is rounded once to h's dtype where diffusers rounds after each product
and sum. The attention and the feed-forwards are the block's own modules (patched where
kiln.patch patched them). Anything else (autograd, hooks on the norms, a norm kiln does not
compute) runs diffusers' forward. Under torch.compile the seams are kiln's in the graph where the
modulation is per sample (no pass of Inductor's reads less); a per-token modulation is traced as
diffusers wrote it, Inductor reading the selection inside the kernels it fuses.
"""

import sys
from typing import Callable, Optional, Tuple

import torch

from .. import activation_ops, norm_ops, rope_ops
from .flux import folded_shift
from .forwards import (SharedAttentionSettings, any_hooks, fused_head_norms, kiln_can_take, norm_eps,
                       records_parameters, signature_kept)
from .per_forward import OncePerForward

BLOCK_OPS = "adaln + gated_adaln + gated_residual"


def _parts(*freqs: torch.Tensor):
    """The real and imaginary parts of each complex frequency tensor, contiguous: fp32 half tables."""
    return tuple(t.contiguous() for f in freqs for t in (f.real, f.imag))


_TABLES = OncePerForward(_parts)


def _freqs_fit(freqs, x: torch.Tensor) -> bool:
    """complex64 [S, D / 2] frequencies for x [B, S, H, D] on x's device."""
    return (isinstance(freqs, torch.Tensor) and freqs.dtype == torch.complex64 and freqs.dim() == 2
            and freqs.device == x.device and freqs.shape[0] == x.shape[1] and 2 * freqs.shape[1] == x.shape[3])


@signature_kept
class QwenImageAttnProcessor(SharedAttentionSettings):
    """diffusers' ``QwenDoubleStreamAttnProcessor2_0.__call__`` with each stream's q/k norms and
    rotation in kiln's launches (see the module's docstring); the projections, the joint
    attention and its backend are diffusers'."""

    def __init__(self, original: object, fuse_norms: bool = False):
        self.original = original
        # The module's q/k norms are RMSNorms one kiln call computes (checked when patched).
        self.fuse_norms = fuse_norms
        module = sys.modules[type(original).__module__]
        self._apply_rotary_emb = module.apply_rotary_emb_qwen
        self._dispatch = module.dispatch_attention_fn

    @staticmethod
    def _tables(image_rotary_emb, img_q, img_k, txt_q, txt_k):
        """(img cos, img sin, txt cos, txt sin) half tables for the streams' q and k
        [B, S, H, D], or None."""
        if not isinstance(image_rotary_emb, tuple) or len(image_rotary_emb) != 2:
            return None
        img_freqs, txt_freqs = image_rotary_emb
        if not (_freqs_fit(img_freqs, img_q) and _freqs_fit(txt_freqs, txt_q) and img_q.dim() == 4
                and img_k.shape == img_q.shape and txt_k.shape == txt_q.shape and txt_q.shape[2:] == img_q.shape[2:]):
            return None
        if torch.is_grad_enabled() and (img_freqs.requires_grad or txt_freqs.requires_grad):
            return None
        return _TABLES.get(img_freqs, txt_freqs)

    def _fused(self, attn, img_q, img_k, txt_q, txt_k, image_rotary_emb):
        """(weights of norm_q, norm_k, norm_added_q, norm_added_k, eps, tables) for one
        ``kiln.head_norm_rope_`` a stream where it computes what the norms and rotation do,
        else None."""
        if not self.fuse_norms or image_rotary_emb is None:
            return None
        norms = fused_head_norms([getattr(attn, name, None) for name in ("norm_q", "norm_k", "norm_added_q",
                                                                          "norm_added_k")],
                                 img_q, img_k, txt_q, txt_k)
        tables = self._tables(image_rotary_emb, img_q, img_k, txt_q, txt_k)
        if norms is None or tables is None:
            return None
        return (*norms, tables)

    def _rotate(self, x_q, x_k, freqs, cos, sin):
        if cos is not None and kiln_can_take(x_q, x_k, differentiable=True):
            return rope_ops.rope(x_q, x_k, cos, sin, interleaved=True, rotary_dim=x_q.shape[3], layout="bshd")
        return (self._apply_rotary_emb(x_q, freqs, use_real=False),
                self._apply_rotary_emb(x_k, freqs, use_real=False))

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor = None,
                 encoder_hidden_states_mask: torch.Tensor = None, attention_mask: Optional[torch.Tensor] = None,
                 image_rotary_emb=None) -> Tuple[torch.Tensor, torch.Tensor]:
        if encoder_hidden_states is None or attention_mask is not None:
            return self.original(attn, hidden_states, encoder_hidden_states, encoder_hidden_states_mask,
                                 attention_mask, image_rotary_emb)
        if encoder_hidden_states_mask is not None:
            image_mask = torch.ones((hidden_states.shape[0], hidden_states.shape[1]), dtype=torch.bool,
                                    device=hidden_states.device)
            attention_mask = torch.cat([encoder_hidden_states_mask, image_mask], dim=1)[:, None, None, :]
        seq_txt = encoder_hidden_states.shape[1]
        head_dim = attn.inner_dim // attn.heads
        img_q, img_k, img_v = (proj(hidden_states).unflatten(-1, (-1, head_dim))
                               for proj in (attn.to_q, attn.to_k, attn.to_v))
        txt_q, txt_k, txt_v = (proj(encoder_hidden_states).unflatten(-1, (-1, head_dim))
                               for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
        fused = self._fused(attn, img_q, img_k, txt_q, txt_k, image_rotary_emb)
        if fused is None:
            img_q, img_k, txt_q, txt_k = (x if norm is None else norm(x) for x, norm in (
                (img_q, attn.norm_q), (img_k, attn.norm_k), (txt_q, attn.norm_added_q), (txt_k, attn.norm_added_k)))
            if image_rotary_emb is not None:
                tables = self._tables(image_rotary_emb, img_q, img_k, txt_q, txt_k) or (None,) * 4
                img_q, img_k = self._rotate(img_q, img_k, image_rotary_emb[0], *tables[:2])
                txt_q, txt_k = self._rotate(txt_q, txt_k, image_rotary_emb[1], *tables[2:])
        joint_q = torch.cat([txt_q, img_q], dim=1)
        joint_k = torch.cat([txt_k, img_k], dim=1)
        joint_v = torch.cat([txt_v, img_v], dim=1)
        if fused is not None:
            weights, eps, (img_cos, img_sin, txt_cos, txt_sin) = fused
            for part, (wq, wk), cos, sin in ((slice(0, seq_txt), weights[2:], txt_cos, txt_sin),
                                             (slice(seq_txt, None), weights[:2], img_cos, img_sin)):
                rope_ops.head_norm_rope_(joint_q[:, part], joint_k[:, part], wq, wk, cos, sin, eps,
                                         interleaved=True, rotary_dim=head_dim, layout="bshd")
        joint = self._dispatch(joint_q, joint_k, joint_v, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
                               backend=self._attention_backend, parallel_config=self._parallel_config)
        joint = joint.flatten(2, 3).to(joint_q.dtype)
        img_out = attn.to_out[0](joint[:, seq_txt:, :].contiguous())
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)
        txt_out = attn.to_add_out(joint[:, :seq_txt, :].contiguous())
        return img_out, txt_out


# ---- the block ---------------------------------------------------------------------------

_NORMS = ("img_norm1", "img_norm2", "txt_norm1", "txt_norm2")


def _fits(module: torch.nn.Module, h, c, temb, index) -> bool:
    # Compiled, a per-token modulation stays diffusers': Inductor reads the selection inside the
    # kernels it fuses, where kiln's would read the selected [B, T, D] chunks made beforehand.
    return not (index is not None and torch.compiler.is_compiling()) and _takes(module, h, c, temb, index)


def _takes(module: torch.nn.Module, h, c, temb, index) -> bool:
    if not all(isinstance(t, torch.Tensor) for t in (h, c, temb)) or h.dim() != 3 or c.dim() != 3 \
            or temb.dim() != 2 or c.shape[2] != h.shape[2] or not kiln_can_take(h, c):
        return False
    for name in _NORMS:
        norm = getattr(module, name)
        if type(norm) is not torch.nn.LayerNorm or tuple(norm.normalized_shape) != (h.shape[-1],) or any_hooks(norm):
            return False
    return not records_parameters(module)


def _chunks(mod: torch.Tensor, index: Optional[torch.Tensor]):
    """(shift, scale, gate) of one modulation's [B', 3D] embedding, each [B, 1, D], or with
    ``index`` [B, T] selected per token as ``_modulate`` selects them: [B, T, D]."""
    shift, scale, gate = mod.chunk(3, dim=-1)
    if index is None:
        return shift[:, None], scale[:, None], gate[:, None]
    half = shift.shape[0] // 2
    first = index.unsqueeze(-1) == 0
    return tuple(torch.where(first, t[:half, None], t[half:, None]) for t in (shift, scale, gate))


def _modulated(norm: torch.nn.LayerNorm, x: torch.Tensor, shift, scale) -> torch.Tensor:
    """norm(x) * (1 + scale) + shift as one kiln.adaln where kiln takes the operands."""
    weight, bias = norm.weight, norm.bias
    if kiln_can_take(x, shift, scale, *[p for p in (weight, bias) if p is not None]):
        return norm_ops.adaln(x, scale, folded_shift(shift, scale, bias), weight, norm_eps(norm, x), "layer")
    return norm(x) * (1 + scale) + shift


def _gated_modulated(norm: torch.nn.LayerNorm, h, y, gate, shift, scale) -> Tuple[torch.Tensor, torch.Tensor]:
    """(h + gate * y, norm2's modulation of it) as one kiln.gated_adaln where kiln takes them."""
    weight, bias = norm.weight, norm.bias
    if y.shape == h.shape and kiln_can_take(h, y, gate, shift, scale, *[p for p in (weight, bias) if p is not None]):
        return norm_ops.gated_adaln(h, y, gate, scale, folded_shift(shift, scale, bias), weight, norm_eps(norm, h),
                                    "layer")
    h = h + gate * y
    return h, norm(h) * (1 + scale) + shift


def _residual(h: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    if y.shape != h.shape or not kiln_can_take(h, y, gate):
        return h + gate * y
    return activation_ops.gated_residual_(h, y, gate)


def qwen_image_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``QwenImageTransformerBlock.forward`` with its seams fused (see the module's docstring)."""

    def forward(hidden_states, encoder_hidden_states, encoder_hidden_states_mask, temb, image_rotary_emb=None,
                joint_attention_kwargs=None, modulate_index=None):
        h, c = hidden_states, encoder_hidden_states
        index = modulate_index if isinstance(modulate_index, torch.Tensor) else None
        if (modulate_index is not None and index is None) or not _fits(module, h, c, temb, index):
            return original(hidden_states, encoder_hidden_states, encoder_hidden_states_mask, temb, image_rotary_emb,
                            joint_attention_kwargs, modulate_index)
        img_mod = module.img_mod(temb)
        txt_mod = module.txt_mod(torch.chunk(temb, 2, dim=0)[0] if module.zero_cond_t else temb)
        img_mod1, img_mod2 = img_mod.chunk(2, dim=-1)
        txt_mod1, txt_mod2 = txt_mod.chunk(2, dim=-1)
        img_shift1, img_scale1, img_gate1 = _chunks(img_mod1, index)
        txt_shift1, txt_scale1, txt_gate1 = _chunks(txt_mod1, None)
        img_in = _modulated(module.img_norm1, h, img_shift1, img_scale1)
        txt_in = _modulated(module.txt_norm1, c, txt_shift1, txt_scale1)
        img_attn, txt_attn = module.attn(hidden_states=img_in, encoder_hidden_states=txt_in,
                                         encoder_hidden_states_mask=encoder_hidden_states_mask,
                                         image_rotary_emb=image_rotary_emb, **(joint_attention_kwargs or {}))
        img_shift2, img_scale2, img_gate2 = _chunks(img_mod2, index)
        txt_shift2, txt_scale2, txt_gate2 = _chunks(txt_mod2, None)
        h, img_in = _gated_modulated(module.img_norm2, h, img_attn, img_gate1, img_shift2, img_scale2)
        c, txt_in = _gated_modulated(module.txt_norm2, c, txt_attn, txt_gate1, txt_shift2, txt_scale2)
        h = _residual(h, module.img_mlp(img_in), img_gate2)
        c = _residual(c, module.txt_mlp(txt_in), txt_gate2)
        if c.dtype == torch.float16:
            c = c.clip(-65504, 65504)
        if h.dtype == torch.float16:
            h = h.clip(-65504, 65504)
        return c, h

    return forward
