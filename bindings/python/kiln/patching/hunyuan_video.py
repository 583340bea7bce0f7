"""HunyuanVideo's transformers (diffusers' ``HunyuanVideoTransformer3DModel``, its FramePack
variant, and ``HunyuanVideo15Transformer3DModel``) and HunyuanImage 2.1's
(``HunyuanImageTransformer2DModel``, HunyuanVideo's blocks and attention for images): their
attention processors and their double- and single-stream blocks' seams.

The attention RMS-normalises each head of q and k and rotates the video tokens' q and k (not the
text's) by diffusers' fp32 table, interleaved pairs: diffusers runs the rotation as about a dozen
kernels with fp32 temporaries a tensor. kiln rotates the video tokens' q and k in one launch:
``kiln.head_norm_rope_`` with the norms, in place on the joint attention's concatenation (a new
tensor), where the norms are RMSNorms kiln computes and no graph is recorded; otherwise after the
norm modules, one ``kiln.rope``. The text tokens' norms stay the modules' (patched as norms). The
single-stream attention reads its video and text inputs, where they are the two halves of one
tensor (the single block's normalised stream), as that tensor instead of concatenating them.

The blocks are FLUX's with HunyuanVideo's arguments and the video stream first: the
double-stream block's seams (``kiln.gated_adaln``, ``kiln.gated_residual_``) and the
single-stream block's (the activation written into ``proj_out``'s input, ``kiln.gated_residual``,
the streams received as the halves of the previous block's output not concatenated again): see
:mod:`.flux_block`. HunyuanVideo 1.5 has double-stream blocks only; its processor builds a
mask of the valid query and key pairs ([B, 1, S, S]) from the text tokens' in every block, by
repeating the token mask S times and and-ing it with its transpose (a strided read of S^2
bytes); kiln's builds the same mask in one broadcast, once a forward. The image-to-video "token
replace" blocks, whose first frame takes a modulation of its own, keep diffusers' forward.
"""

import importlib
import inspect
import sys
from typing import Callable, Optional

import torch

from .. import rope_ops
from .flux import FluxAttnProcessor
from .flux_block import double_stream, fits_double, fits_single, joined, single_output
from .forwards import SharedAttentionSettings, fused_head_norms, kiln_can_take, signature_kept
from .per_forward import OncePerForward


@signature_kept
class HunyuanVideoAttnProcessor(SharedAttentionSettings):
    """diffusers' ``HunyuanVideoAttnProcessor2_0.__call__`` with the video tokens' q/k norms and
    rotation in kiln's launches (see the module's docstring); the projections, the text's norms,
    the attention and its backend are diffusers'."""

    def __init__(self, original: object, fuse_norms: bool = False):
        self.original = original
        # The module's q/k norms are RMSNorms one kiln call computes (checked when patched).
        self.fuse_norms = fuse_norms
        module = type(original).__module__
        self._dispatch = sys.modules[module].dispatch_attention_fn
        self._apply_rotary_emb = importlib.import_module(".embeddings", module.rsplit(".", 2)[0]).apply_rotary_emb

    def _mask(self, attention_mask, query: torch.Tensor):
        return attention_mask

    def _fused(self, attn, query, key, image_rotary_emb, video: int):
        """(weights, eps, table) for one ``kiln.head_norm_rope_`` of the first ``video`` tokens of
        q and k, or None."""
        if not self.fuse_norms or image_rotary_emb is None:
            return None
        norms = fused_head_norms((attn.norm_q, attn.norm_k), query, key)
        table = FluxAttnProcessor._table(query[:, :video], key[:, :video], image_rotary_emb)
        if norms is None or table is None or (torch.is_grad_enabled() and any(t.requires_grad for t in table)):
            return None
        return (*norms, table)

    def _rotated(self, x_q, x_k, image_rotary_emb, video: int):
        """q and k with their first ``video`` tokens rotated (diffusers' order: after the norms)."""
        table = FluxAttnProcessor._table(x_q[:, :video], x_k[:, :video], image_rotary_emb)
        if table is not None and kiln_can_take(x_q, x_k, differentiable=True):
            q, k = rope_ops.rope(x_q[:, :video], x_k[:, :video], *table, interleaved=True, layout="bshd")
        else:
            q = self._apply_rotary_emb(x_q[:, :video], image_rotary_emb, sequence_dim=1)
            k = self._apply_rotary_emb(x_k[:, :video], image_rotary_emb, sequence_dim=1)
        if video == x_q.shape[1]:
            return q, k
        return torch.cat([q, x_q[:, video:]], dim=1), torch.cat([k, x_k[:, video:]], dim=1)

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor] = None,
                 attention_mask: Optional[torch.Tensor] = None, image_rotary_emb=None):
        single = attn.add_q_proj is None and encoder_hidden_states is not None
        joint = attn.add_q_proj is not None and encoder_hidden_states is not None
        video = hidden_states.shape[1]
        x = joined(hidden_states, encoder_hidden_states) if single else hidden_states
        query, key, value = (proj(x).unflatten(2, (attn.heads, -1)) for proj in (attn.to_q, attn.to_k, attn.to_v))
        fused = self._fused(attn, query, key, image_rotary_emb, video)
        if fused is None:
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
            if image_rotary_emb is not None:
                query, key = self._rotated(query, key, image_rotary_emb, video)
        elif single:
            # The text tokens of the joined stream: normalised as diffusers does, not rotated.
            query[:, video:] = attn.norm_q(query[:, video:])
            key[:, video:] = attn.norm_k(key[:, video:])
        if joint:
            text = [proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
                    for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)]
            if attn.norm_added_q is not None:
                text[0] = attn.norm_added_q(text[0])
            if attn.norm_added_k is not None:
                text[1] = attn.norm_added_k(text[1])
            query, key, value = (torch.cat([a, b], dim=1) for a, b in zip((query, key, value), text))
        if fused is not None:
            weights, eps, (cos, sin) = fused
            rope_ops.head_norm_rope_(query[:, :video], key[:, :video], weights[0], weights[1], cos, sin, eps,
                                     interleaved=True, layout="bshd")
        hidden_states = self._dispatch(query, key, value, attn_mask=self._mask(attention_mask, query), dropout_p=0.0,
                                       is_causal=False, backend=self._attention_backend,
                                       parallel_config=self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is not None:
            text = encoder_hidden_states.shape[1]
            hidden_states, encoder_hidden_states = hidden_states[:, :-text], hidden_states[:, -text:]
            if getattr(attn, "to_out", None) is not None:
                hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
            if getattr(attn, "to_add_out", None) is not None:
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states


def _pair_mask(attention_mask: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
    """HunyuanVideo 1.5's [B, 1, S, S] mask of the query and key pairs that are both valid (the
    text tokens' mask padded with the video's, valid), in one broadcast where diffusers repeats the
    token mask S times and ands it with its transpose."""
    valid = torch.nn.functional.pad(attention_mask, (seq - attention_mask.shape[-1], 0), value=True)
    valid = valid.bool().reshape(batch, seq)  # as diffusers' view(batch, 1, 1, seq) reads it
    return valid[:, None, :, None] & valid[:, None, None, :]


# Every block of a forward receives the same text mask: its pair mask (S^2 bytes) is made once.
# (_pair_mask looked up when called, so that a test may count the masks made.)
_PAIR_MASKS = OncePerForward(lambda attention_mask, batch, seq: _pair_mask(attention_mask, batch, seq))


@signature_kept
class HunyuanVideo15AttnProcessor(HunyuanVideoAttnProcessor):
    """diffusers' ``HunyuanVideo15AttnProcessor2_0.__call__``: HunyuanVideo's joint attention,
    its mask of valid query and key pairs as diffusers builds it from the text tokens' (made once
    a forward)."""

    def _mask(self, attention_mask, query: torch.Tensor):
        if torch.compiler.is_compiling():  # Inductor fuses the broadcast into the attention's graph
            return _pair_mask(attention_mask, *query.shape[:2])
        return _PAIR_MASKS.get(attention_mask, extra=tuple(query.shape[:2]))


# ---- the blocks ------------------------------------------------------------------------------


def double_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``HunyuanVideoTransformerBlock.forward`` (and HunyuanVideo 1.5's and HunyuanImage's) with its
    seams fused as FLUX's double block's are."""
    # The rotation's argument: freqs_cis (HunyuanVideo's), image_rotary_emb (HunyuanImage's).
    rope_name = tuple(inspect.signature(original).parameters)[4]

    def forward(hidden_states, encoder_hidden_states, temb, attention_mask=None, *args, **kwargs):
        h, c = hidden_states, encoder_hidden_states
        if not fits_double(module, h, c, temb, None):
            return original(hidden_states, encoder_hidden_states, temb, attention_mask, *args, **kwargs)
        rope = args[0] if args else kwargs.get(rope_name)
        norm_h, *video = module.norm1(h, emb=temb)
        norm_c, *text = module.norm1_context(c, emb=temb)
        attn, c_attn = module.attn(hidden_states=norm_h, encoder_hidden_states=norm_c, attention_mask=attention_mask,
                                   image_rotary_emb=rope)
        return (double_stream(module.norm2, module.ff, h, attn, *video),
                double_stream(module.norm2_context, module.ff_context, c, c_attn, *text))

    return forward


def single_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``HunyuanVideoSingleTransformerBlock.forward`` with its concatenations and gated residual
    fused as FLUX's single block's are, the video stream first."""

    def forward(hidden_states, encoder_hidden_states, temb, attention_mask=None, image_rotary_emb=None, *args,
                **kwargs):
        h, c = hidden_states, encoder_hidden_states
        if not fits_single(module, h, c, temb, None):
            return original(hidden_states, encoder_hidden_states, temb, attention_mask, image_rotary_emb, *args,
                            **kwargs)
        video = h.shape[1]
        x = joined(h, c)
        norm_x, gate = module.norm(x, emb=temb)
        mlp = module.proj_mlp(norm_x)
        attn = module.attn(hidden_states=norm_x[:, :video], encoder_hidden_states=norm_x[:, video:],
                           attention_mask=attention_mask, image_rotary_emb=image_rotary_emb)
        x = single_output(module, x, joined(*attn), mlp, gate)
        return x[:, :video], x[:, video:]

    return forward
