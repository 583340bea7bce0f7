"""Qwen-Image's patterns (:mod:`.qwen_image`), each confirmed on a probe as
:mod:`.detect_dit`'s are: its attention (found by its processor's ``__call__``) and its
transformer block (found by its two streams' modulations, norms and feed-forwards); and Qwen-Image
2.1's (:mod:`.qwen_image21`): its attention (its default processor's ``__call__``) and its
single-stream block (its norms, attention and feed-forward, and the model's modulation as an
argument)."""

import inspect
from typing import Callable, Union

import torch

from . import qwen_image, qwen_image21
from .detect import NoMatch, _Swapped
from .detect_dit import (_PROBE_DIM, DitMatch, attention_match, _confirmed, _fused_or_plain, _linear, _norm_weights,
                         _ProbeFF, _processor_call)

_BLOCK_CHILDREN = ("img_mod", "img_norm1", "attn", "img_norm2", "img_mlp", "txt_mod", "txt_norm1", "txt_norm2",
                   "txt_mlp")
_BLOCK_ARGUMENTS = ("hidden_states", "encoder_hidden_states", "encoder_hidden_states_mask", "temb",
                    "image_rotary_emb", "joint_attention_kwargs", "modulate_index")


def attention_candidate(module: torch.nn.Module) -> bool:
    return _processor_call(module) == "QwenDoubleStreamAttnProcessor2_0.__call__"


def block_candidate(module: torch.nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Module) for n in _BLOCK_CHILDREN) \
        and callable(getattr(module, "_modulate", None))


def _freqs(tokens: int, head_dim: int, g: torch.Generator) -> torch.Tensor:
    angles = 40 * torch.randn(tokens, head_dim // 2, generator=g)
    return torch.polar(torch.ones_like(angles), angles)


def classify_attention(module: torch.nn.Module, processor, fuse_norms: bool = True) -> Union[DitMatch, NoMatch]:
    """kiln's processor for a Qwen-Image attention, with the per-head q/k norms in its launches
    where they are RMSNorms kiln computes (and ``fuse_norms``: kiln.patch's ops include
    ``rms_norm``)."""
    heads, inner = getattr(module, "heads", None), getattr(module, "inner_dim", None)
    if not isinstance(heads, int) or not isinstance(inner, int) or heads <= 0 or inner % heads or (inner // heads) % 2:
        return NoMatch("attention", f"its heads ({heads!r}) do not split its width {inner!r} into even head dims")
    head_dim = inner // heads
    g = torch.Generator().manual_seed(0)
    children = {name: _linear(_PROBE_DIM, inner, g)
                for name in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj")}
    children["to_add_out"] = _linear(inner, _PROBE_DIM, g)
    swaps = [_Swapped(module, children=children), _Swapped(module.to_out, children={"0": _linear(inner, _PROBE_DIM, g)})]
    x = torch.randn(2, 6, _PROBE_DIM, generator=g)
    enc = torch.randn(2, 3, _PROBE_DIM, generator=g)
    rope = (_freqs(6, head_dim, g), _freqs(3, head_dim, g))
    mask = torch.tensor([[True, True, False], [True, False, True]])
    calls = [((module, x), dict(encoder_hidden_states=enc, image_rotary_emb=rope)),
             ((module, x), dict(encoder_hidden_states=enc, encoder_hidden_states_mask=mask, image_rotary_emb=rope)),
             ((module, x), dict(encoder_hidden_states=enc))]
    norms = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")
    why, fuse_norms = _fused_or_plain(module, processor, qwen_image.QwenImageAttnProcessor, calls, swaps, norms, g,
                                      fuse_norms)
    if why is not None:
        return NoMatch("attention", f"does not compute Qwen-Image's attention as kiln's processor does: {why}")
    return attention_match(fuse_norms, qwen_image.QwenImageAttnProcessor,
                           "qwen-image attention (per-head q/k rms_norm + rope)", "qwen-image attention (rope of q and k)")


class _ProbeJointAttention(torch.nn.Module):
    """A stand-in for the joint attention: elementwise, every argument changes its outputs."""

    def __init__(self, dim: int, g: torch.Generator):
        super().__init__()
        self.w, self.b, self.c = (torch.randn(dim, generator=g) for _ in range(3))

    def forward(self, hidden_states, encoder_hidden_states, encoder_hidden_states_mask=None, image_rotary_emb=None):
        img = torch.tanh(hidden_states * self.w + self.b) + encoder_hidden_states.mean(1, keepdim=True) * self.b
        if image_rotary_emb is not None:
            img = img + image_rotary_emb
        return img, torch.tanh(encoder_hidden_states * self.c)


def classify_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    norms = [getattr(module, name) for name in qwen_image._NORMS]
    if any(type(n) is not torch.nn.LayerNorm or len(n.normalized_shape) != 1 for n in norms):
        return NoMatch("block", "its norms are not LayerNorms over the last dimension")
    if tuple(inspect.signature(original).parameters) != _BLOCK_ARGUMENTS:
        return NoMatch("block", f"its forward does not take Qwen-Image's block arguments {_BLOCK_ARGUMENTS}")
    d = norms[0].normalized_shape[0]
    zero_cond = bool(getattr(module, "zero_cond_t", False))
    g = torch.Generator().manual_seed(0)
    children = {"img_mod": _linear(d, 6 * d, g), "txt_mod": _linear(d, 6 * d, g),
                "attn": _ProbeJointAttention(d, g), "img_mlp": _ProbeFF(d, g), "txt_mlp": _ProbeFF(d, g)}
    swaps = [_Swapped(module, children=children)] + _norm_weights(module, qwen_image._NORMS, g)
    h = torch.randn(2, 5, d, generator=g) + 0.5
    c = torch.randn(2, 3, d, generator=g) - 0.5
    rope = 0.1 * torch.randn(d, generator=g)
    if zero_cond:
        # Qwen-Image-Edit: the embeddings of two timesteps, chosen per image token.
        index = torch.tensor([[0, 0, 1, 1, 0], [1, 0, 1, 0, 0]])
        calls = [((h, c, None, torch.randn(4, d, generator=g), rope, None, index), {})]
    else:
        calls = [((h, c, None, torch.randn(2, d, generator=g), rope), {})]
    patched = qwen_image.qwen_image_block(module, original)
    match = DitMatch("qwen-image block (adaln, gated residual + norm seams)", qwen_image.BLOCK_OPS, "adaln",
                     qwen_image.qwen_image_block)
    return _confirmed(match, original, patched, calls, swaps, "Qwen-Image's block seams")


def attention21_candidate(module: torch.nn.Module) -> bool:
    return _processor_call(module) == "QwenImage21AttnProcessor.__call__"


def classify_attention21(module: torch.nn.Module, processor, fuse_norms: bool = True) -> Union[DitMatch, NoMatch]:
    """kiln's processor for a Qwen-Image 2.1 attention, with the per-head q/k norms in the
    rotation's launch where they are RMSNorms kiln computes (and ``fuse_norms``)."""
    heads, inner = getattr(module, "heads", None), getattr(module, "inner_dim", None)
    if not isinstance(heads, int) or not isinstance(inner, int) or heads <= 0 or inner % heads or (inner // heads) % 2:
        return NoMatch("attention", f"its heads ({heads!r}) do not split its width {inner!r} into even head dims")
    g = torch.Generator().manual_seed(0)
    children = {name: _linear(_PROBE_DIM, inner, g) for name in ("to_q", "to_k", "to_v")}
    swaps = [_Swapped(module, children=children),
             _Swapped(module.to_out, children={"0": _linear(inner, _PROBE_DIM, g)})]
    x = torch.randn(2, 7, _PROBE_DIM, generator=g)
    rope = _freqs(7, inner // heads, g)
    # The prefill (a prompt segment, a condition image's, then the target image, the second
    # sample's prompt padded), the decode (no segments), and no rotation.
    segments = [(0, 2, True), (2, 4, False)]
    key_valid = torch.tensor([[True] * 7, [True, False] + [True] * 5])
    calls = [((module, x), dict(rotary_emb=rope, segments=segments, key_valid=key_valid)),
             ((module, x), dict(rotary_emb=rope)), ((module, x), {})]
    why, fuse_norms = _fused_or_plain(module, processor, qwen_image21.QwenImage21AttnProcessor, calls, swaps,
                                      ("norm_q", "norm_k"), g, fuse_norms)
    if why is not None:
        return NoMatch("attention", f"does not compute Qwen-Image 2.1's attention as kiln's processor does: {why}")
    return attention_match(fuse_norms, qwen_image21.QwenImage21AttnProcessor,
                           "qwen-image 2.1 attention (per-head q/k rms_norm + rope)",
                           "qwen-image 2.1 attention (rope of q and k)")


_BLOCK21_ARGUMENTS = ("hidden_states", "modulation", "rotary_emb", "attention_mask", "target_token_mask",
                      "layer_cache", "kv_cache_mode", "cache_write_slice", "segments", "key_valid")


def block21_candidate(module: torch.nn.Module) -> bool:
    children = qwen_image21.NORMS + ("attn", "img_mlp")
    return all(isinstance(getattr(module, n, None), torch.nn.Module) for n in children) \
        and callable(getattr(module, "_modulate", None)) and getattr(module, "txt_mod", None) is None


class _ProbeAttention21(torch.nn.Module):
    """A stand-in for Qwen-Image 2.1's attention: elementwise in the tokens it is given, its
    rotation changing its output."""

    def __init__(self, dim: int, g: torch.Generator):
        super().__init__()
        self.w, self.b = torch.randn(dim, generator=g), torch.randn(dim, generator=g)

    def forward(self, hidden_states, attention_mask=None, rotary_emb=None, layer_cache=None, kv_cache_mode=None,
                cache_write_slice=None, segments=None, key_valid=None):
        out = torch.tanh(hidden_states * self.w + self.b)
        return out if rotary_emb is None else out + rotary_emb


def classify_block21(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    norms = [getattr(module, name) for name in qwen_image21.NORMS]
    if any(type(n) is not torch.nn.LayerNorm or len(n.normalized_shape) != 1 or n.weight is not None
           or n.bias is not None for n in norms):
        return NoMatch("block", "its norms are not LayerNorms over the last dimension with no affine parameters")
    if tuple(inspect.signature(original).parameters) != _BLOCK21_ARGUMENTS:
        return NoMatch("block", f"its forward does not take Qwen-Image 2.1's block arguments {_BLOCK21_ARGUMENTS}")
    d = norms[0].normalized_shape[0]
    g = torch.Generator().manual_seed(0)
    swaps = [_Swapped(module, children={"attn": _ProbeAttention21(d, g), "img_mlp": _ProbeFF(d, g)})]
    h = torch.randn(2, 5, d, generator=g) + 0.5
    rope = 0.1 * torch.randn(d, generator=g)
    # Per sample; and with causal_condition, the target image's tokens (the last three) on their
    # sample's row, the others on the extra t = 0 row.
    mask = torch.tensor([False, False, True, True, True])
    calls = [((h, torch.randn(2, 4 * d, generator=g), rope), {}),
             ((), dict(hidden_states=h, modulation=torch.randn(3, 4 * d, generator=g), rotary_emb=rope,
                       target_token_mask=mask))]
    match = DitMatch("qwen-image 2.1 block (adaln, gated residual + norm seams)", qwen_image21.BLOCK_OPS, "adaln",
                     qwen_image21.qwen_image21_block)
    return _confirmed(match, original, qwen_image21.qwen_image21_block(module, original), calls, swaps,
                      "Qwen-Image 2.1's block seams")


CANDIDATES = (
    (attention_candidate, classify_attention),
    (block_candidate, classify_block),
    (attention21_candidate, classify_attention21),
    (block21_candidate, classify_block21),
)
