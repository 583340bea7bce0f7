"""FLUX.2's patterns (:mod:`.flux2`), each confirmed on a probe as :mod:`.detect_dit`'s are: its
single blocks' parallel attention (found by its processor's ``__call__``) and its double- and
single-stream blocks (found by their children and their forwards' arguments, which FLUX.1's
blocks do not share). Its double-stream attention is FLUX.1's (:mod:`.detect_dit`)."""

import inspect
from typing import Callable, Union

import torch

from . import flux2, replace
from .detect import NoMatch, _Swapped
from .detect_dit import (_PROBE_DIM, DitMatch, attention_match, _confirmed, _FluxProbeAttention, _fused_or_plain,
                         _linear, _ProbeFF, _ProbeMixer, _processor_call)

_DOUBLE_ARGUMENTS = ("hidden_states", "encoder_hidden_states", "temb_mod_img", "temb_mod_txt", "image_rotary_emb",
                     "joint_attention_kwargs")
_SINGLE_ARGUMENTS = ("hidden_states", "encoder_hidden_states", "temb_mod", "image_rotary_emb",
                     "joint_attention_kwargs", "split_hidden_states", "text_seq_len")


def _takes(module: torch.nn.Module, arguments: tuple) -> bool:
    try:
        return tuple(inspect.signature(replace.original_forward(module)).parameters) == arguments
    except (TypeError, ValueError):
        return False


def parallel_attention_candidate(module: torch.nn.Module) -> bool:
    return _processor_call(module) == "Flux2ParallelSelfAttnProcessor.__call__"


def double_block_candidate(module: torch.nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Module)
               for n in ("norm1", "norm1_context", "attn", "norm2", "norm2_context", "ff", "ff_context")) \
        and _takes(module, _DOUBLE_ARGUMENTS)


def single_block_candidate(module: torch.nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Module) for n in ("norm", "attn")) \
        and _takes(module, _SINGLE_ARGUMENTS)


def classify_parallel_attention(module: torch.nn.Module, processor,
                                fuse_norms: bool = True) -> Union[DitMatch, NoMatch]:
    """kiln's processor for a FLUX.2 single block's parallel attention, its per-head q/k norms in
    its launch where they are RMSNorms kiln computes (and ``fuse_norms``)."""
    head_dim, inner = getattr(module, "head_dim", None), getattr(module, "inner_dim", None)
    mlp = getattr(module, "mlp_hidden_dim", None)
    if not all(isinstance(v, int) for v in (head_dim, inner, mlp)) or head_dim % 2 or inner % head_dim:
        return NoMatch("attention", f"its head_dim {head_dim!r} does not split its width {inner!r} into even heads")
    g = torch.Generator().manual_seed(0)
    children = {"to_qkv_mlp_proj": _linear(_PROBE_DIM, 3 * inner + mlp * module.mlp_mult_factor, g),
                "to_out": _linear(inner + mlp, _PROBE_DIM, g)}
    swaps = [_Swapped(module, children=children)]
    x = torch.randn(2, 6, _PROBE_DIM, generator=g)
    angles = 40 * torch.randn(6, head_dim // 2, generator=g)
    rope = (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1))
    calls = [((module, x), dict(image_rotary_emb=rope)), ((module, x), {})]
    why, fuse_norms = _fused_or_plain(module, processor, flux2.Flux2ParallelAttnProcessor, calls, swaps,
                                      ("norm_q", "norm_k"), g, fuse_norms)
    if why is not None:
        return NoMatch("attention", f"does not compute FLUX.2's parallel attention as kiln's processor does: {why}")
    return attention_match(fuse_norms, flux2.Flux2ParallelAttnProcessor,
                           "flux.2 parallel attention (per-head q/k rms_norm + rope, swiglu into to_out's input)",
                           "flux.2 parallel attention (rope of q and k, swiglu into to_out's input)")


def _layer_norm_width(module: torch.nn.Module, name: str) -> Union[int, NoMatch]:
    norm = getattr(module, name)
    if type(norm) is not torch.nn.LayerNorm or len(norm.normalized_shape) != 1 \
            or norm.weight is not None or norm.bias is not None:
        return NoMatch("block", f"its {name} is not a LayerNorm without parameters, as FLUX.2's are")
    return norm.normalized_shape[0]


def classify_double_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    widths = [_layer_norm_width(module, n) for n in ("norm1", "norm1_context", "norm2", "norm2_context")]
    for w in widths:
        if isinstance(w, NoMatch):
            return w
    d = widths[0]
    g = torch.Generator().manual_seed(0)
    children = {"attn": _FluxProbeAttention(d, g, joint=True), "ff": _ProbeFF(d, g), "ff_context": _ProbeFF(d, g)}
    h = torch.randn(2, 5, d, generator=g) + 0.5
    c = torch.randn(2, 3, d, generator=g) - 0.5
    rope = 0.1 * torch.randn(d, generator=g)
    calls = [((h, c, torch.randn(2, 6 * d, generator=g), torch.randn(2, 6 * d, generator=g), rope, None), {})]
    patched = flux2.flux2_double_block(module, original)
    match = DitMatch("flux.2 double block (adaln, gated residual + norm seams)", flux2.DOUBLE_OPS, "adaln",
                     flux2.flux2_double_block)
    return _confirmed(match, original, patched, calls, [_Swapped(module, children=children)],
                      "FLUX.2's double-stream block seams")


def classify_single_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    d = _layer_norm_width(module, "norm")
    if isinstance(d, NoMatch):
        return d
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, d, generator=g) + 0.5
    temb = torch.randn(2, 3 * d, generator=g)
    rope = 0.1 * torch.randn(d, generator=g)
    calls = [((x, None, temb, rope, None), {}),
             ((x[:, 3:], x[:, :3], temb, rope, None), dict(split_hidden_states=True))]
    patched = flux2.flux2_single_block(module, original)
    match = DitMatch("flux.2 single block (adaln, gated residual)", flux2.SINGLE_OPS, "adaln", flux2.flux2_single_block)
    swaps = [_Swapped(module, children={"attn": _ProbeMixer(d, g)})]
    return _confirmed(match, original, patched, calls, swaps, "FLUX.2's single-stream block seams")


# Tried before detect_dit's: FLUX.1's double-block candidate has a FLUX.2 block's children too.
CANDIDATES = (
    (parallel_attention_candidate, classify_parallel_attention),
    (double_block_candidate, classify_double_block),
    (single_block_candidate, classify_single_block),
)
