"""Chroma's replacements (diffusers' ``ChromaTransformer2DModel``): FLUX's blocks with the
modulation pruned out of them.

Chroma's blocks have no modulation projections: the model computes every block's shift, scale and
gate rows at once (its approximator, ``[B, 3 * singles + 12 * doubles + 2, D]``) and hands each
block its slice, which the block's pruned AdaLN modules flatten and chunk. kiln:

* the pruned AdaLN modules (``ChromaAdaLayerNormZeroPruned``, ``...ZeroSinglePruned``,
  ``...ContinuousPruned``): the norm and the modulation as one ``kiln.adaln``, the rows read in
  place where the module slices them;
* the double block: FLUX's seams (:func:`.flux_block.double_stream`), each stream's gated residual
  with its norm2's modulation one ``kiln.gated_adaln`` and the feed-forward's gated residual one
  ``kiln.gated_residual_``;
* the single block (called on the joined text and image stream): the MLP's activation written
  beside the attention's output into the buffer ``proj_out`` reads, the gated residual one
  ``kiln.gated_residual`` (:func:`.flux_block.single_output`).

The attention mask (the prompt's padding, which Chroma's pipeline passes) is expanded as diffusers
expands it, once a forward rather than once a block, and handed to the attention. Anything else
(autograd through the blocks, IP-adapter inputs, a norm2 with parameters or hooks, torch.compile
tracing the single block) runs diffusers' forward.
"""

from typing import Callable

import torch

from .flux import modulated_module
from .flux_block import double_stream, fits_double, fits_single, single_stream
from .per_forward import OncePerForward

BLOCK_OPS = "gated_adaln + gated_residual"
_FP16_MAX = 65504

# chunk count: (the order of the chunks, what is returned after x, whether emb is cast to x's dtype)
PRUNED_LAYOUTS = {
    6: (("shift", "scale", "gate", "shift_mlp", "scale_mlp", "gate_mlp"),
        ("gate", "shift_mlp", "scale_mlp", "gate_mlp"), False),
    3: (("shift", "scale", "gate"), ("gate",), False),
    2: (("shift", "scale"), (), True),
}
PRUNED_NAMES = {6: "zero", 3: "zero single", 2: "continuous"}


def pruned_adaln(chunks: int, norm: str) -> Callable:
    """A factory for a pruned AdaLN module's forward: ``emb`` ``[B, chunks, D]`` flattened (and
    cast to x's dtype where the module casts it) as the module does, ``norm(x) * (1 + scale) +
    shift`` one ``kiln.adaln``."""
    order, returned, cast = PRUNED_LAYOUTS[chunks]

    def modulation(module: torch.nn.Module, x: torch.Tensor, e: torch.Tensor):
        if e.dim() != 3 or e.shape[1] != chunks:
            return None
        return e.flatten(1, 2).to(x.dtype) if cast else e.flatten(1, 2)

    return modulated_module("emb", order, returned, norm, modulation)


def _pairwise(mask: torch.Tensor) -> torch.Tensor:
    return mask[:, None, None, :] * mask[:, None, :, None]


# Every block of a forward expands the same [B, N] mask into the same [B, 1, N, N] one (N^2 a
# sample: 21 MB at 1024x1024, a kernel a block): expanded once a forward.
_PAIRWISE = OncePerForward(_pairwise)


def _expanded(mask):
    """The pairwise mask Chroma's blocks make of a [B, N] padding mask, made once for the blocks
    of a forward (the same tensor for each while the mask is unchanged)."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or torch.compiler.is_compiling():
        return _pairwise(mask)
    return _PAIRWISE.get(mask)


def chroma_double_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``ChromaTransformerBlock.forward`` with FLUX's seams fused (see the module's docstring)."""

    def forward(hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, attention_mask=None,
                joint_attention_kwargs=None):
        h, c = hidden_states, encoder_hidden_states
        if not fits_double(module, h, c, temb, joint_attention_kwargs):
            return original(hidden_states, encoder_hidden_states, temb, image_rotary_emb, attention_mask,
                            joint_attention_kwargs)
        norm_h, *image = module.norm1(h, emb=temb[:, :6])
        norm_c, *text = module.norm1_context(c, emb=temb[:, 6:])
        outputs = module.attn(hidden_states=norm_h, encoder_hidden_states=norm_c, image_rotary_emb=image_rotary_emb,
                              attention_mask=_expanded(attention_mask), **(joint_attention_kwargs or {}))
        attn, c_attn = outputs[0], outputs[1]
        new_h = double_stream(module.norm2, module.ff, h, attn, *image)
        if len(outputs) == 3:
            new_h = new_h + outputs[2]
        new_c = double_stream(module.norm2_context, module.ff_context, c, c_attn, *text)
        if new_c.dtype == torch.float16:
            new_c = new_c.clip(-_FP16_MAX, _FP16_MAX)
        return new_c, new_h

    return forward


def chroma_single_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``ChromaSingleTransformerBlock.forward`` with its concatenation and gated residual fused
    (see the module's docstring)."""

    def forward(hidden_states, temb, image_rotary_emb=None, attention_mask=None, joint_attention_kwargs=None):
        x = hidden_states
        if not fits_single(module, x, x, temb, joint_attention_kwargs):
            return original(hidden_states, temb, image_rotary_emb, attention_mask, joint_attention_kwargs)
        return single_stream(module, x, temb, image_rotary_emb=image_rotary_emb,
                             attention_mask=_expanded(attention_mask))

    return forward
