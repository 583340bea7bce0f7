"""FLUX.3's patterns, each confirmed on a probe as :mod:`.detect_dit`'s are: its attention
(:mod:`.flux3`, found by its processor's ``__call__``), and its per-mode and joint blocks, its
modulation heads and its output norm (:mod:`.flux3_block`, found by their children and their
forwards' arguments), and its transformer's forward (:mod:`.flux3_model`)."""

from typing import Callable, Union

import torch

from . import flux3, flux3_block, flux3_model
from .detect import NoMatch, _Swapped
from .detect_dit import (_PROBE_DIM, DitMatch, attention_match, _confirmed, _fused_or_plain, _linear, _ProbeFF,
                         _ProbeMixer, _processor_call)
from .detect_flux2 import _takes
from .flux_block import plain_layer_norm

_MODE_ARGUMENTS = ("hidden_states", "temb_mod", "image_rotary_emb")
_SINGLE_ARGUMENTS = ("hidden_states", "encoder_hidden_states", "temb_mod", "temb_mod_context", "image_rotary_emb")


def attention_candidate(module: torch.nn.Module) -> bool:
    return _processor_call(module) == "Flux3AttnProcessor.__call__"


def classify_attention(module: torch.nn.Module, processor, fuse_norms: bool = True) -> Union[DitMatch, NoMatch]:
    """kiln's processor for a FLUX.3 attention: its fp32 per-head q/k norms and the rotation in
    one launch where the norms are RMSNorms kiln computes (and ``fuse_norms``), else the rotation."""
    head_dim, heads = getattr(module, "head_dim", None), getattr(module, "heads", None)
    if not isinstance(head_dim, int) or not isinstance(heads, int) or head_dim % 2:
        return NoMatch("attention", f"its head_dim {head_dim!r} is not even")
    inner = heads * head_dim
    g = torch.Generator().manual_seed(0)
    if getattr(module, "fused_projections", False):
        children = {"to_qkv": _linear(_PROBE_DIM, 3 * inner, g)}
    else:
        children = {name: _linear(_PROBE_DIM, inner, g) for name in ("to_q", "to_k", "to_v")}
    swaps = [_Swapped(module, children=children),
             _Swapped(module.to_out, children={"0": _linear(inner, _PROBE_DIM, g)})]
    x = torch.randn(2, 6, _PROBE_DIM, generator=g)
    angles = 40 * torch.randn(6, head_dim // 2, generator=g)
    rope = (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1))
    calls = [((module, x), dict(image_rotary_emb=rope)), ((module, x), {})]
    why, fused = _fused_or_plain(module, processor, flux3.Flux3AttnProcessor, calls, swaps, ("norm_q", "norm_k"), g,
                                 fuse_norms)
    if why is not None:
        return NoMatch("attention", f"does not compute FLUX.3's attention as kiln's processor does: {why}")
    return attention_match(fused, flux3.Flux3AttnProcessor, "flux.3 attention (per-head q/k rms_norm + rope)",
                           "flux.3 attention (rope)")


def _has(module: torch.nn.Module, *children: str) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Module) for n in children)


def mode_block_candidate(module: torch.nn.Module) -> bool:
    return _has(module, "norm", "attn", "ff") and _takes(module, _MODE_ARGUMENTS)


def single_block_candidate(module: torch.nn.Module) -> bool:
    return _has(module, "norm", "attn", "ff") and _takes(module, _SINGLE_ARGUMENTS)


def modulation_candidate(module: torch.nn.Module) -> bool:
    return isinstance(getattr(module, "linear", None), torch.nn.Linear) and len(list(module.children())) == 1 \
        and _takes(module, ("temb",))


def output_norm_candidate(module: torch.nn.Module) -> bool:
    return _has(module, "act_fn", "linear", "norm") and isinstance(module.linear, torch.nn.Linear) \
        and _takes(module, ("hidden_states", "temb"))


def _plain_norm_width(module: torch.nn.Module) -> Union[int, NoMatch]:
    norm = module.norm
    if type(norm) is not torch.nn.LayerNorm or len(norm.normalized_shape) != 1 \
            or not plain_layer_norm(norm, norm.normalized_shape[0]):
        return NoMatch("block", "its norm is not a LayerNorm without parameters or hooks, as FLUX.3's are")
    return norm.normalized_shape[0]


def _modulations(g: torch.Generator, rows: int, width: int):
    """A per-token [2, rows, width] modulation and one expanded from a row a sample."""
    return torch.randn(2, rows, width, generator=g), torch.randn(2, 1, width, generator=g).expand(2, rows, width)


def _block_swaps(module: torch.nn.Module, d: int, g: torch.Generator) -> list:
    """Stand-ins for a block's attention and its feed-forward's projections (a feed-forward of
    another form: a stand-in for all of it)."""
    swaps = [_Swapped(module, children={"attn": _ProbeMixer(d, g)})]
    ff = module.ff
    if _has(ff, "linear_in", "act_fn", "linear_out"):
        hidden = 8
        swaps.append(_Swapped(ff, children={"linear_in": _linear(d, 2 * hidden, g, bias=False),
                                            "linear_out": _linear(hidden, d, g, bias=False)}))
    else:
        swaps.append(_Swapped(module, children={"ff": _ProbeFF(d, g)}))
    return swaps


def _block_probe(module: torch.nn.Module):
    """(width, generator, 5 tokens of a stream, a rotation stand-in) for a block's probe, or a
    NoMatch where its norm is not FLUX.3's."""
    d = _plain_norm_width(module)
    if isinstance(d, NoMatch):
        return d
    g = torch.Generator().manual_seed(0)
    return d, g, torch.randn(2, 5, d, generator=g) + 0.5, 0.1 * torch.randn(d, generator=g)


def classify_mode_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    probe = _block_probe(module)
    if isinstance(probe, NoMatch):
        return probe
    d, g, h, rope = probe
    calls = [((h, mod, rope), {}) for mod in _modulations(g, 5, 3 * d)]
    match = DitMatch("flux.3 mode block (adaln, attention + feed-forward in one matmul, gated residual)",
                     flux3_block.MODE_OPS, "adaln", flux3_block.flux3_mode_block)
    return _confirmed(match, original, flux3_block.flux3_mode_block(module, original), calls,
                      _block_swaps(module, d, g), "FLUX.3's per-mode block seams")


def classify_single_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    probe = _block_probe(module)
    if isinstance(probe, NoMatch):
        return probe
    d, g, h, rope = probe
    c = torch.randn(2, 3, d, generator=g) - 0.5
    (mod, mod_rows), (c_mod, c_mod_rows) = _modulations(g, 5, 3 * d), _modulations(g, 3, 3 * d)
    calls = [((h, c, mod, c_mod_rows, rope), {}), ((h, c, mod_rows, c_mod, rope), {})]
    match = DitMatch("flux.3 joint block (adaln, attention + feed-forward in one matmul, gated residual)",
                     flux3_block.SINGLE_OPS, "adaln", flux3_block.flux3_single_block)
    return _confirmed(match, original, flux3_block.flux3_single_block(module, original), calls,
                      _block_swaps(module, d, g), "FLUX.3's joint block seams")


def classify_modulation(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    lin = module.linear
    g = torch.Generator().manual_seed(0)
    calls = [((t,), {}) for t in _modulations(g, 4, lin.in_features)]
    swaps = [_Swapped(module, children={"linear": _linear(lin.in_features, lin.out_features, g,
                                                         bias=lin.bias is not None)})]
    match = DitMatch("flux.3 modulation (one row a sample of an expanded embedding)", "none", "adaln",
                     flux3_block.flux3_modulation)
    return _confirmed(match, original, flux3_block.flux3_modulation(module, original), calls, swaps,
                      "a projection of each row", what="modulation")


def classify_output_norm(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    d = _plain_norm_width(module)
    if isinstance(d, NoMatch):
        return d
    lin = module.linear
    if lin.out_features != 2 * d:
        return NoMatch("adaln", f"its linear's {lin.out_features} outputs are not a scale and a shift of width {d}")
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 5, d, generator=g) + 0.5
    calls = [((h, t), {}) for t in _modulations(g, 5, lin.in_features)]
    swaps = [_Swapped(module, children={"linear": _linear(lin.in_features, 2 * d, g, bias=lin.bias is not None)})]
    match = DitMatch("flux.3 output adaln (layer norm, one row a sample of an expanded embedding)",
                     flux3_block.OUTPUT_NORM_OPS, "adaln", flux3_block.flux3_output_norm)
    return _confirmed(match, original, flux3_block.flux3_output_norm(module, original), calls, swaps,
                      "norm(x) * (1 + scale) + shift with scale and shift from linear(silu(temb))", what="adaln")


CANDIDATES = (
    (flux3_model.candidate, flux3_model.classify),
    (attention_candidate, classify_attention),
    (mode_block_candidate, classify_mode_block),
    (single_block_candidate, classify_single_block),
    (modulation_candidate, classify_modulation),
    (output_norm_candidate, classify_output_norm),
)
