"""FLUX.3's transformer (diffusers' ``Flux3Transformer2DModel``) with the elementwise work between
its matmuls fused and its modulation computed once a sample. Its attentions are
:mod:`.flux3`'s; here are its blocks, its modulation heads and its output norm.

FLUX.3 modulates per token: the model expands each mode's timestep embedding to every token of
that mode ([B, S, D], the same row S times) and its modulation heads project that
([B, S, 3D] each: four projections of 4096 identical rows at 1024x1024), so every block reads a
shift, a scale and a gate row for each token. kiln:

* a modulation head (``Flux3Modulation``) given an expanded embedding (stride 0 over the tokens,
  as the text's and the reference image's are, and the image's under
  :mod:`.flux3_model`) projects one row a sample and expands the result;
* per-mode block (``Flux3ModeTransformerBlock``): its LayerNorm and ``(1 + scale) * x + shift``
  -> one ``kiln.adaln``; ``attn + ff`` -> the attention's output added in the feed-forward's
  output projection (``torch.addmm``'s epilogue, where that projection is a plain
  ``nn.Linear``); ``h + gate * (attn + ff)`` -> one ``kiln.gated_residual``;
* joint block (``Flux3SingleTransformerBlock``): each stream's modulated norm -> one
  ``kiln.adaln``, the same sum, and each stream's gated residual -> one ``kiln.gated_residual``
  of its slice of the sum;
* output norm (``Flux3AdaLayerNorm``): ``linear(silu(temb))`` of one row a sample where temb is
  expanded, its modulated LayerNorm -> one ``kiln.adaln``.

A modulation read as one row a sample takes kiln's per-sample kernels, which read it once a
CTA instead of once a token. Each seam is rounded once to h's dtype where diffusers rounds after
each product and sum, and the feed-forward's sum in its matmul's fp32 accumulator. The attentions
and feed-forwards are the blocks' own modules (patched where kiln.patch patched them). Anything
else (autograd, norms with parameters or hooks, modulations of another shape, torch.compile's
tracing of the blocks, where Inductor fuses the seams itself) runs diffusers' forward; a
modulation head projects one row a sample under autograd and torch.compile too.
"""

from typing import Callable

import torch

from .. import activation_ops, norm_ops
from .flux2 import _blocks_run_kiln, _fits
from .flux_block import plain_layer_norm
from .forwards import any_hooks, kiln_can_take, norm_eps

MODE_OPS = "adaln + gated_residual"
SINGLE_OPS = "adaln + gated_residual"
OUTPUT_NORM_OPS = "adaln"


def per_sample(m: torch.Tensor) -> torch.Tensor:
    """``m`` [B, S, K] as [B, 1, K] where its rows are one sample's row expanded (stride 0 over
    the tokens), so that a kernel reads it once a sample; else ``m``."""
    if m.dim() == 3 and m.shape[1] > 1 and m.stride(1) == 0:
        return m[:, :1]
    return m


def flux3_modulation(module: torch.nn.Module, original: Callable) -> Callable:
    """``Flux3Modulation.forward`` (``linear(temb)``) projecting one row a sample of an expanded
    embedding and expanding the result as the embedding was."""

    def forward(temb):
        if not isinstance(temb, torch.Tensor) or per_sample(temb) is temb:
            return original(temb)
        out = module.linear(temb[:, :1])
        return out.expand(temb.shape[0], temb.shape[1], out.shape[-1])

    return forward


def ff_plus(ff: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``ff(x) + y`` for FLUX.3's feed-forward (``linear_out(act_fn(linear_in(x)))``), y added in
    the output projection's matmul (``torch.addmm``) where that projection is a plain
    ``nn.Linear`` without bias or hooks of y's dtype; else as written."""
    lin = getattr(ff, "linear_out", None)
    if type(lin) is not torch.nn.Linear or lin.bias is not None or any_hooks(ff) or any_hooks(lin) \
            or lin.weight.dtype != y.dtype or lin.weight.device != y.device:
        return ff(x) + y
    a = ff.act_fn(ff.linear_in(x))
    if a.shape[:-1] != y.shape[:-1] or y.shape[-1] != lin.out_features or a.dtype != y.dtype:
        return lin(a) + y
    return torch.addmm(y.reshape(-1, y.shape[-1]), a.reshape(-1, a.shape[-1]), lin.weight.t()).view(y.shape)


def _modulation(temb_mod: torch.Tensor, x: torch.Tensor):
    """(shift, scale, gate) of a [B, S, 3D] modulation for x [B, S, D], each read as one row a
    sample where it is one (:func:`per_sample`), or None where they do not fit x."""
    if not isinstance(temb_mod, torch.Tensor) or temb_mod.dim() != 3 or temb_mod.shape[-1] != 3 * x.shape[-1]:
        return None
    chunks = [per_sample(m) for m in torch.chunk(temb_mod, 3, dim=-1)]
    return chunks if _fits(x, *chunks) else None


def flux3_mode_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``Flux3ModeTransformerBlock.forward`` with its seams fused (see the module's docstring)."""

    def forward(hidden_states, temb_mod, image_rotary_emb):
        h = hidden_states
        chunks = None
        if _blocks_run_kiln(module, None) and isinstance(h, torch.Tensor) and h.dim() == 3 \
                and plain_layer_norm(module.norm, h.shape[-1]):
            chunks = _modulation(temb_mod, h)
        if chunks is None:
            return original(hidden_states, temb_mod, image_rotary_emb)
        shift, scale, gate = chunks
        norm_h = norm_ops.adaln(h, scale, shift, None, norm_eps(module.norm, h), "layer")
        attn = module.attn(hidden_states=norm_h, image_rotary_emb=image_rotary_emb)
        if attn.shape != h.shape or not kiln_can_take(h, attn):
            return h + gate * (attn + module.ff(norm_h))
        return activation_ops.gated_residual(h, ff_plus(module.ff, norm_h, attn), gate)

    return forward


def flux3_single_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``Flux3SingleTransformerBlock.forward`` with its seams fused (see the module's docstring)."""

    def forward(hidden_states, encoder_hidden_states, temb_mod, temb_mod_context, image_rotary_emb):
        h, c = hidden_states, encoder_hidden_states
        chunks = c_chunks = None
        if _blocks_run_kiln(module, None) and all(isinstance(t, torch.Tensor) for t in (h, c)) \
                and h.dim() == 3 and c.dim() == 3 and h.shape[::2] == c.shape[::2] \
                and plain_layer_norm(module.norm, h.shape[-1]):
            chunks, c_chunks = _modulation(temb_mod, h), _modulation(temb_mod_context, c)
        if chunks is None or c_chunks is None or not kiln_can_take(h, c):
            return original(hidden_states, encoder_hidden_states, temb_mod, temb_mod_context, image_rotary_emb)
        (shift, scale, gate), (c_shift, c_scale, c_gate) = chunks, c_chunks
        eps = norm_eps(module.norm, h)
        combined = torch.cat([norm_ops.adaln(c, c_scale, c_shift, None, eps, "layer"),
                              norm_ops.adaln(h, scale, shift, None, eps, "layer")], dim=1)
        attn = module.attn(hidden_states=combined, image_rotary_emb=image_rotary_emb)
        text = c.shape[1]
        if attn.shape != combined.shape or not kiln_can_take(h, attn):
            out = attn + module.ff(combined)
            return c + c_gate * out[:, :text], h + gate * out[:, text:]
        out = ff_plus(module.ff, combined, attn)
        return (activation_ops.gated_residual(c, out[:, :text], c_gate),
                activation_ops.gated_residual(h, out[:, text:], gate))

    return forward


def flux3_output_norm(module: torch.nn.Module, original: Callable) -> Callable:
    """``Flux3AdaLayerNorm.forward``: ``linear(silu(temb))`` of one row a sample where temb is
    expanded, and ``norm(x) * (1 + scale) + shift`` as one ``kiln.adaln`` (as written while
    torch.compile traces it or autograd records)."""

    def forward(hidden_states, temb):
        h = hidden_states
        if not (isinstance(h, torch.Tensor) and isinstance(temb, torch.Tensor) and h.dim() == 3
                and temb.dim() == 3 and plain_layer_norm(module.norm, h.shape[-1])):
            return original(hidden_states, temb)
        emb = module.linear(module.act_fn(per_sample(temb)))
        scale, shift = torch.chunk(emb, 2, dim=-1)
        if not _blocks_run_kiln(module, None) or not _fits(h, scale, shift):
            return module.norm(h) * (1 + scale) + shift
        return norm_ops.adaln(h, scale, shift, None, norm_eps(module.norm, h), "layer")

    return forward
