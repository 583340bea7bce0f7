"""The diffusion-transformer patterns kiln.patch recognises, each confirmed on a probe.

Candidates are found by attributes (a video rotary embedding: LTX-Video's grid sizes and
theta; an attention module: its processor's ``__call__``, whose code is what is replaced;
a transformer block: norm1, norm2, attn1, attn2, ff and a 6-row ``scale_shift_table``; an
AdaLN module: ``linear``, ``silu`` and a ``norm``). A candidate is replaced only when the
replacement computes what the original computes on a random fp32 CPU probe: the module's
projections, attentions or feed-forward are swapped for small random stand-ins (so the
probe is cheap whatever the model's size, and runs wherever its weights are), and every
output of the original and the replacement must agree. Its inner norms are first
classified by what they compute (:func:`detect.classify_norm`).
"""

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple, Union

import torch

from . import cogvideox_block, detect, flux, flux_block, ltx, ltx_rope, replace, wan, wan_block
from .. import rope_ops
from .detect import NoMatch, _Swapped


@dataclass(frozen=True)
class DitMatch:
    kind: str
    op: str  # the kiln op(s) the replacement calls
    family: str  # the name in kiln.patching.OPS that selects it
    factory: Callable  # (module, original forward) -> forward; for a processor: (original processor) -> processor
    target: str = "forward"  # or "processor"


_PROBE_DIM = 8  # the stand-in projections' outer width


def attention_match(fused: bool, processor_cls, fused_kind: str, plain_kind: str, fused_op: str = "head_norm_rope",
                    fused_family: str = "rope") -> DitMatch:
    """The match of an attention whose processor kiln replaces: with its head norms in the
    rotation's launch where ``fused`` (``processor_cls`` with ``fuse_norms=True``, calling
    ``fused_op``), else its rotation alone (``kiln.rope``)."""
    if fused:
        return DitMatch(fused_kind, fused_op, fused_family, functools.partial(processor_cls, fuse_norms=True),
                        target="processor")
    return DitMatch(plain_kind, "rope", "rope", processor_cls, target="processor")


def _processor_call(module: torch.nn.Module) -> str:
    proc = getattr(module, "processor", None)
    if proc is None or not type(proc).__module__.startswith("diffusers."):
        return ""
    return getattr(type(proc).__call__, "__qualname__", "")


def video_rope_candidate(module: torch.nn.Module) -> bool:
    names = ("dim", "base_num_frames", "base_height", "base_width", "patch_size", "patch_size_t", "theta")
    return all(hasattr(module, n) for n in names) and callable(getattr(module, "_prepare_video_coords", None))


def ltx_attention_candidate(module: torch.nn.Module) -> bool:
    return _processor_call(module) == "LTXVideoAttnProcessor.__call__"


# diffusers' processors that compute FLUX.1's attention, each confirmed on the probe: FLUX.2's
# double-stream one, and those of the models built as FLUX copies (Bria 3.x, Bria FIBO,
# LongCat-Image, Ovis-Image).
_FLUX_PROCESSORS = ("FluxAttnProcessor.__call__", "Flux2AttnProcessor.__call__", "BriaAttnProcessor.__call__",
                    "BriaFiboAttnProcessor.__call__", "LongCatImageAttnProcessor.__call__",
                    "OvisImageAttnProcessor.__call__")


def flux_attention_candidate(module: torch.nn.Module) -> bool:
    return _processor_call(module) in _FLUX_PROCESSORS


# diffusers' Wan processor and those that compute what it does, with kiln's processor of each.
_WAN_PROCESSORS = {"WanAttnProcessor.__call__": wan.WanAttnProcessor,
                   "SkyReelsV2AttnProcessor.__call__": wan.SkyReelsV2AttnProcessor}


def wan_attention_candidate(module: torch.nn.Module) -> bool:
    # Wan's cross-attentions are called without tables: their processor computes what it did.
    return _processor_call(module) in _WAN_PROCESSORS and not getattr(module, "is_cross_attention", False)


def wan_block_candidate(module: torch.nn.Module) -> bool:
    table = getattr(module, "scale_shift_table", None)
    return all(isinstance(getattr(module, n, None), torch.nn.Module)
               for n in ("norm1", "norm2", "norm3", "attn1", "attn2", "ffn")) \
        and isinstance(table, torch.Tensor) and table.dim() == 3


def ltx_block_candidate(module: torch.nn.Module) -> bool:
    table = getattr(module, "scale_shift_table", None)
    return all(isinstance(getattr(module, n, None), torch.nn.Module) for n in ("norm1", "norm2", "attn1", "attn2", "ff")) \
        and isinstance(table, torch.Tensor) and table.dim() == 2


def flux_double_block_candidate(module: torch.nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Module)
               for n in ("norm1", "norm1_context", "attn", "norm2", "norm2_context", "ff", "ff_context"))


def flux_single_block_candidate(module: torch.nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Module)
               for n in ("norm", "proj_mlp", "act_mlp", "proj_out", "attn")) \
        and isinstance(getattr(module.proj_mlp, "in_features", None), int)


def adaln_candidate(module: torch.nn.Module) -> bool:
    linear, norm = getattr(module, "linear", None), getattr(module, "norm", None)
    return isinstance(getattr(linear, "out_features", None), int) and isinstance(norm, torch.nn.Module) \
        and callable(getattr(module, "silu", None)) and detect.norm_candidate(norm)


def _rms_norm_child(module: torch.nn.Module, name: str) -> Union[detect.Match, NoMatch]:
    """The child norm's classification; an RMSNorm one kiln.rms_norm call computes."""
    norm = getattr(module, name, None)
    if not isinstance(norm, torch.nn.Module) or not detect.norm_candidate(norm):
        return NoMatch("norm", f"{name} is not a norm module")
    result = detect.classify_norm(norm, replace.original_forward(norm))
    if isinstance(result, NoMatch):
        return NoMatch("norm", f"{name} {result.reason}")
    if result.op != "rms_norm" or result.factory is detect.forwards.rms_norm_offset:
        return NoMatch("norm", f"{name} computes {result.kind}, not an RMSNorm one kiln.rms_norm call computes")
    return result


def _rms_norm_children(module: torch.nn.Module, names, what: str) -> Optional[NoMatch]:
    """None where each named child is an RMSNorm one kiln.rms_norm call computes, else why not
    (a NoMatch of ``what``)."""
    for name in names:
        result = _rms_norm_child(module, name)
        if isinstance(result, NoMatch):
            return NoMatch(what, result.reason)
    return None


def _worst(expected, actual) -> Optional[str]:
    """None when every tensor of actual agrees with expected's (within fp32 rounding of the
    output's own scale) and it returns None where expected does, else how they differ."""
    if isinstance(expected, torch.Tensor):
        expected, actual = (expected,), (actual,) if isinstance(actual, torch.Tensor) else actual
    if not isinstance(actual, tuple) or len(actual) != len(expected):
        return f"returns {type(actual).__name__} where the original returns {len(expected)} tensors"
    for e, a in zip(expected, actual):
        if e is None or a is None:
            if e is not a:
                return "returns None where the original returns a tensor, or the other way round"
            continue
        why = detect._agree(e, a, scale=e.abs().max().item() if e.numel() else 0.0)
        if why is not None:
            return why
    return None


def _compare_calls(original: Callable, patched: Callable, calls) -> Optional[str]:
    for args, kwargs in calls:
        try:
            expected = original(*args, **kwargs)
        except Exception as e:
            return f"its forward fails on the probe ({type(e).__name__}: {e})"
        try:
            actual = patched(*args, **kwargs)
        except Exception as e:
            return f"the replacement fails on the probe ({type(e).__name__}: {e})"
        why = _worst(expected, actual)
        if why is not None:
            return f"the replacement {why}"
    return None


def _confirmed(match: DitMatch, original: Callable, patched: Callable, calls, swaps, computes: str,
               what: str = "block") -> Union[DitMatch, NoMatch]:
    """``match`` where ``patched`` computes what ``original`` does on every probe call (with
    ``swaps`` in place, no autograd); else why not (``computes``: what the original computes)."""
    with torch.no_grad(), _Stack(swaps):
        why = _compare_calls(original, patched, calls)
    if why is not None:
        return NoMatch(what, f"does not compute {computes}: {why}")
    return match


def _linear(n_in: int, n_out: int, g: torch.Generator, bias: bool = True) -> torch.nn.Linear:
    lin = torch.nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n_out, n_in, generator=g) / n_in ** 0.5)
        if bias:
            lin.bias.copy_(0.1 * torch.randn(n_out, generator=g))
    return lin.requires_grad_(False)


def _norm_weights(module: torch.nn.Module, names, g: torch.Generator) -> list:
    """Swaps for the named child norms' weights and biases: random fp32 values near 1 and 0."""
    swaps = []
    for name in names:
        norm = getattr(module, name, None)
        weight, bias = getattr(norm, "weight", None), getattr(norm, "bias", None)
        params = {}
        if isinstance(weight, torch.Tensor):
            params["weight"] = 1 + 0.3 * torch.randn(weight.shape, generator=g)
        if isinstance(bias, torch.Tensor):
            params["bias"] = 0.3 * torch.randn(bias.shape, generator=g)
        if params:
            swaps.append(_Swapped(norm, params=params))
    return swaps


class _Stack:
    def __init__(self, contexts):
        self.contexts = contexts

    def __enter__(self):
        for c in self.contexts:
            c.__enter__()
        return self

    def __exit__(self, *exc):
        for c in reversed(self.contexts):
            c.__exit__(*exc)
        return False


class _LocalAttention:
    """The processor's attention backend and parallel settings, off for a CPU probe."""

    def __init__(self, processor):
        self.processor = processor

    def __enter__(self):
        self.saved = {n: self.processor.__dict__[n] for n in ("_attention_backend", "_parallel_config")
                      if n in self.processor.__dict__}
        for n in ("_attention_backend", "_parallel_config"):
            self.processor.__dict__[n] = None

    def __exit__(self, *exc):
        for n in ("_attention_backend", "_parallel_config"):
            self.processor.__dict__.pop(n, None)
        self.processor.__dict__.update(self.saved)
        return False


# ---- LTX-Video -------------------------------------------------------------------------

_PROBE_GRID = (2, 2, 3)


def _pair_probe_table(dim: int, grid, scale, module) -> tuple:
    """kiln's own angles for a grid, read back as diffusers' (cos, sin) layout: rotating
    the pairs (1, 0) gives (cos, sin) of each pair's angle."""
    s = grid[0] * grid[1] * grid[2]
    ones = torch.zeros(1, s, dim)
    ones[..., 0::2] = 1.0
    out, _ = rope_ops.rope_3d(ones, ones, *grid, scale, base_num_frames=module.base_num_frames,
                              base_height=module.base_height, base_width=module.base_width,
                              patch_size_t=module.patch_size_t, patch_size=module.patch_size,
                              theta=float(module.theta))
    cos = out[..., 0::2].repeat_interleave(2, -1)
    sin = out[..., 1::2].repeat_interleave(2, -1)
    return cos, sin


def classify_video_rope(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    dim = module.dim
    if not isinstance(dim, int) or dim < 6 or dim % 2:
        return NoMatch("rope", f"its width {dim!r} is not an even number >= 6, as kiln's video RoPE takes")
    frames, height, width = _PROBE_GRID
    s = frames * height * width
    for scale in (None, (0.32, 32.0, 32.0)):
        try:
            with torch.no_grad():
                cos, sin = original(torch.zeros(1, s, 1), frames, height, width, scale)
        except Exception as e:
            return NoMatch("rope", f"its forward fails on the probe ({type(e).__name__}: {e})")
        if not (isinstance(cos, torch.Tensor) and cos.shape == (1, s, dim) and sin.shape == cos.shape):
            return NoMatch("rope", "it does not return (cos, sin) of shape [B, S, dim]")
        kc, ks = _pair_probe_table(dim, _PROBE_GRID, scale, module)
        # fp32 holds the angles (up to pi/2 * theta * |2g - 1|) only to a few ulps of their size.
        coords = [n - 1 for n in _PROBE_GRID]
        if scale is not None:
            patch = (module.patch_size_t, module.patch_size, module.patch_size)
            base = (module.base_num_frames, module.base_height, module.base_width)
            coords = [c * sc * p / b for c, sc, p, b in zip(coords, scale, patch, base)]
        largest_angle = math.pi / 2 * float(module.theta) * max(max(abs(2 * c - 1) for c in coords), 1.0)
        tol = 8 * largest_angle * 2.0 ** -24 + 1e-6
        err = max((kc - cos.float()).abs().max().item(), (ks - sin.float()).abs().max().item())
        if not err <= tol:
            return NoMatch("rope", f"its angles differ from kiln's video RoPE by {err:.3g} (scale {scale})")
    return DitMatch("ltx video rope (tags its tables with their grid, built on first read)",
                    "rms_norm_rope (angles in-kernel)", "rms_norm_rope", ltx_rope.video_rope)


def classify_ltx_attention(module: torch.nn.Module, processor) -> Union[DitMatch, NoMatch]:
    why = _rms_norm_children(module, ("norm_q", "norm_k"), "attention")
    if why is not None:
        return why
    g = torch.Generator().manual_seed(0)
    inner, inner_kv = module.to_q.out_features, module.to_k.out_features
    children = {"to_q": _linear(_PROBE_DIM, inner, g), "to_k": _linear(_PROBE_DIM, inner_kv, g),
                "to_v": _linear(_PROBE_DIM, inner_kv, g)}
    frames, height, width = _PROBE_GRID
    s = frames * height * width
    x = torch.randn(2, s, _PROBE_DIM, generator=g)
    enc = torch.randn(2, 5, _PROBE_DIM, generator=g)
    mask = torch.zeros(2, 1, 5)
    mask[1, :, 3:] = -10000.0
    angles = 40 * torch.randn(1, s, inner // 2, generator=g)
    table = (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1))
    calls = [((module, x), dict(image_rotary_emb=table)),
             ((module, x), dict(encoder_hidden_states=enc, attention_mask=mask))]
    if inner >= 6 and inner % 2 == 0:
        scale = (0.32, 32.0, 32.0)
        probe_rope = torch.nn.Module()
        probe_rope.__dict__.update(base_num_frames=20, base_height=2048, base_width=2048, patch_size_t=1,
                                   patch_size=1, theta=10000.0)
        cos, sin = _pair_probe_table(inner, _PROBE_GRID, scale, probe_rope)
        grid_rope = ltx_rope.VideoRotaryEmbedding((cos, sin), _PROBE_GRID, scale, (20, 2048, 2048), (1, 1),
                                                  10000.0)
        calls.append(((module, x), dict(image_rotary_emb=grid_rope)))
    patched = ltx.LTXAttnProcessor(processor)
    swaps = [_Swapped(module, children=children), _Swapped(module.to_out, children={"0": _linear(inner, _PROBE_DIM, g)})]
    with torch.no_grad(), _LocalAttention(processor), _Stack(swaps + _norm_weights(module, ("norm_q", "norm_k"), g)):
        why = _compare_calls(processor, patched, calls)
    if why is not None:
        return NoMatch("attention", f"does not compute LTX-Video's attention as kiln's processor does: {why}")
    return DitMatch("ltx attention (q/k rms_norm + rope)", "rms_norm_rope + rms_norm", "rms_norm_rope",
                    ltx.LTXAttnProcessor, target="processor")


class _ProbeMixer(torch.nn.Module):
    """A stand-in for an attention: elementwise, but every argument changes its output."""

    def __init__(self, dim: int, g: torch.Generator):
        super().__init__()
        self.w = torch.randn(dim, generator=g)
        self.b = torch.randn(dim, generator=g)

    def forward(self, hidden_states, encoder_hidden_states=None, image_rotary_emb=None, attention_mask=None):
        y = torch.tanh(hidden_states * self.w + self.b)
        if encoder_hidden_states is not None:
            y = y + encoder_hidden_states.mean(1, keepdim=True) * self.b
        if image_rotary_emb is not None:
            y = y + image_rotary_emb
        if attention_mask is not None:
            y = y + attention_mask.mean()
        return y


class _ProbeFF(torch.nn.Module):
    def __init__(self, dim: int, g: torch.Generator):
        super().__init__()
        self.w = torch.randn(dim, generator=g)

    def forward(self, x):
        return torch.tanh(x * self.w)


def classify_ltx_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    why = _rms_norm_children(module, ("norm1", "norm2"), "block")
    if why is not None:
        return why
    table = module.scale_shift_table
    if table.shape[0] != 6:
        return NoMatch("block", f"its scale_shift_table has {table.shape[0]} rows, not LTX-Video's 6")
    d = table.shape[1]
    params = inspect.signature(original).parameters
    needed = ("hidden_states", "encoder_hidden_states", "temb", "image_rotary_emb", "encoder_attention_mask")
    if tuple(params) != needed:
        return NoMatch("block", f"its forward takes {tuple(params)}, not LTX-Video's block arguments {needed}")
    g = torch.Generator().manual_seed(0)
    children = {"attn1": _ProbeMixer(d, g), "attn2": _ProbeMixer(d, g), "ff": _ProbeFF(d, g)}
    h = torch.randn(2, 5, d, generator=g) + 0.5
    enc = torch.randn(2, 3, d, generator=g)
    rope = 0.1 * torch.randn(d, generator=g)
    mask = torch.randn(2, 1, 3, generator=g)
    calls = [((), dict(hidden_states=h, encoder_hidden_states=enc, temb=torch.randn(2, t, 6 * d, generator=g),
                       image_rotary_emb=rope, encoder_attention_mask=mask)) for t in (1, 5)]
    patched = ltx.ltx_block(module, original)
    swaps = [_Swapped(module, params={"scale_shift_table": torch.randn(6, d, generator=g) / d ** 0.5}, children=children)]
    match = DitMatch("ltx block (adaln, gated residual, residual + adaln seam)", ltx.BLOCK_OPS, "adaln",
                     ltx.ltx_block)
    return _confirmed(match, original, patched, calls, swaps + _norm_weights(module, ("norm1", "norm2"), g),
                      "LTX-Video's block seams")


# ---- FLUX ------------------------------------------------------------------------------


def _fused_or_plain(module, processor, processor_cls, calls, swaps, norms, g: torch.Generator, fuse_norms: bool):
    """(why the probe failed or None, whether the norms are fused) for kiln's processor of an
    attention whose q/k norms may join its rotation: fused first where ``fuse_norms`` and the
    norms are RMSNorms one kiln call computes, else (or where that fails) the norms apart."""
    fuse = fuse_norms and all(not isinstance(_rms_norm_child(module, name), NoMatch) for name in norms)
    why = None
    for fused in ((True, False) if fuse else (False,)):
        g.manual_seed(1)
        with torch.no_grad(), _LocalAttention(processor), _Stack(swaps + _norm_weights(module, norms, g)):
            why = _compare_calls(processor, processor_cls(processor, fuse_norms=fused), calls)
        if why is None:
            return None, fused
    return why, False


def classify_flux_attention(module: torch.nn.Module, processor, fuse_norms: bool = True) -> Union[DitMatch, NoMatch]:
    """kiln's processor for a FLUX attention, with the per-head q/k norms in its launches where
    they are RMSNorms (and ``fuse_norms``: kiln.patch's ops include ``rms_norm``)."""
    g = torch.Generator().manual_seed(0)
    head_dim = getattr(module, "head_dim", None)
    if head_dim is None and isinstance(getattr(module, "inner_dim", None), int) and module.heads:
        head_dim = module.inner_dim // module.heads  # diffusers' Attention keeps no head_dim
    if not isinstance(head_dim, int) or head_dim % 2:
        return NoMatch("attention", f"its head_dim {head_dim!r} is not even")
    inner = module.heads * head_dim
    children: Dict[str, torch.nn.Module] = {}
    joint = getattr(module, "added_kv_proj_dim", None) is not None
    if getattr(module, "fused_projections", False):
        children["to_qkv"] = _linear(_PROBE_DIM, 3 * inner, g)
        if joint:
            children["to_added_qkv"] = _linear(_PROBE_DIM, 3 * inner, g)
    else:
        for name in ("to_q", "to_k", "to_v") + (("add_q_proj", "add_k_proj", "add_v_proj") if joint else ()):
            children[name] = _linear(_PROBE_DIM, inner, g)
    if joint and isinstance(getattr(module, "to_add_out", None), torch.nn.Module):
        children["to_add_out"] = _linear(inner, _PROBE_DIM, g)
    swaps = [_Swapped(module, children=children)]
    if isinstance(getattr(module, "to_out", None), torch.nn.ModuleList):
        swaps.append(_Swapped(module.to_out, children={"0": _linear(inner, _PROBE_DIM, g)}))
    x = torch.randn(2, 6, _PROBE_DIM, generator=g)
    enc = torch.randn(2, 3, _PROBE_DIM, generator=g) if joint else None
    s = 6 + (3 if joint else 0)
    angles = 40 * torch.randn(s, head_dim // 2, generator=g)
    rope = (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1))
    calls = [((module, x), dict(encoder_hidden_states=enc, image_rotary_emb=rope))]
    norms = ("norm_q", "norm_k") + (("norm_added_q", "norm_added_k") if joint else ())
    # Where the per-head q/k norms are RMSNorms, they and the rotation are one launch a stream.
    why, fuse_norms = _fused_or_plain(module, processor, flux.FluxAttnProcessor, calls, swaps, norms, g, fuse_norms)
    if why is not None:
        return NoMatch("attention", f"does not compute FLUX's attention as kiln's processor does: {why}")
    return attention_match(fuse_norms, flux.FluxAttnProcessor, "flux attention (per-head q/k rms_norm + rope)",
                           "flux attention (rope of q and k)")


class _ProbeAdaLN(torch.nn.Module):
    """A stand-in for FLUX's AdaLayerNormZero(Single): x transformed, and `chunks` [B, D]
    modulation tensors, each from emb."""

    def __init__(self, dim: int, chunks: int, g: torch.Generator):
        super().__init__()
        self.w = torch.randn(dim, generator=g)
        self.v = torch.randn(chunks, dim, generator=g)

    def forward(self, x, emb=None):
        return (torch.tanh(x * self.w),) + tuple(torch.tanh(emb * v) for v in self.v)


class _FluxProbeAttention(_ProbeMixer):
    """_ProbeMixer called as FLUX's blocks call their attentions: the joint one returns the
    image and the text stream, the single one the joined stream."""

    def __init__(self, dim: int, g: torch.Generator, joint: bool):
        super().__init__(dim, g)
        self.joint = joint
        self.c = torch.randn(dim, generator=g)

    def forward(self, hidden_states, encoder_hidden_states=None, image_rotary_emb=None):
        y = super().forward(hidden_states, None, image_rotary_emb)
        return (y, torch.tanh(encoder_hidden_states * self.c)) if self.joint else y


class _ProbeProjOut(torch.nn.Module):
    """A stand-in for the single block's proj_out: [.., D + M] to [.., D], every column read."""

    def __init__(self, dim: int, mlp: int, g: torch.Generator):
        super().__init__()
        self.dim = dim
        self.w = torch.randn(dim, generator=g)
        self.v = torch.randn(mlp, dim, generator=g) / mlp ** 0.5

    def forward(self, x):
        return torch.tanh(x[..., :self.dim] * self.w) + x[..., self.dim:] @ self.v


_FLUX_BLOCK_ARGUMENTS = ("hidden_states", "encoder_hidden_states", "temb", "image_rotary_emb",
                         "joint_attention_kwargs")


def _flux_block_calls(d: int, g: torch.Generator, adjacent: bool):
    """Probe calls of a FLUX block: 5 image and 3 text tokens of width d; with `adjacent`, one
    more whose text and image streams are the two halves of one tensor."""
    h = torch.randn(2, 5, d, generator=g) + 0.5
    c = torch.randn(2, 3, d, generator=g) - 0.5
    temb, rope = torch.randn(2, d, generator=g), 0.1 * torch.randn(d, generator=g)
    calls = [((h, c, temb, rope, None), {})]
    if adjacent:
        both = torch.randn(2, 8, d, generator=g)
        calls.append(((), dict(hidden_states=both[:, 3:], encoder_hidden_states=both[:, :3], temb=temb,
                               image_rotary_emb=rope)))
    return calls


def double_block_width(module: torch.nn.Module, model: str) -> Union[int, NoMatch]:
    """The width of a FLUX-like double block whose norm2 and norm2_context (where it has one: a
    last block whose text stream ends at its norm has none) are LayerNorms over the last dimension
    with no parameters, as ``model``'s are (flux_block's seams); else why not."""
    norm2 = module.norm2
    if not isinstance(norm2, torch.nn.LayerNorm) or len(norm2.normalized_shape) != 1:
        return NoMatch("block", "its norm2 is not a LayerNorm over the last dimension")
    for name in ("norm2", "norm2_context"):
        norm = getattr(module, name, None)
        if norm is not None and (norm.weight is not None or norm.bias is not None):
            return NoMatch("block", f"its {name} has parameters; {model}'s have none")
    return norm2.normalized_shape[0]


def classify_flux_double_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    d = double_block_width(module, "FLUX")
    if isinstance(d, NoMatch):
        return d
    arguments = tuple(inspect.signature(original).parameters)
    if arguments[:-1] != _FLUX_BLOCK_ARGUMENTS[:-1] or arguments[-1] not in flux_block.KWARGS_NAMES:
        return NoMatch("block", f"its forward takes {arguments}, not FLUX's block arguments {_FLUX_BLOCK_ARGUMENTS}")
    g = torch.Generator().manual_seed(0)
    children = {"norm1": _ProbeAdaLN(d, 4, g), "norm1_context": _ProbeAdaLN(d, 4, g),
                "attn": _FluxProbeAttention(d, g, joint=True), "ff": _ProbeFF(d, g), "ff_context": _ProbeFF(d, g)}
    patched = flux_block.flux_double_block(module, original)
    match = DitMatch("flux double block (gated residual + norm seams)", flux_block.DOUBLE_OPS, "adaln",
                     flux_block.flux_double_block)
    return _confirmed(match, original, patched, _flux_block_calls(d, g, adjacent=False),
                      [_Swapped(module, children=children)], "FLUX's double-stream block seams")


def single_block_probe(module: torch.nn.Module, norm: Callable, attention: Callable):
    """(width, generator, MLP activation, stand-ins) for a probe of a FLUX-form single block
    (FLUX's, Chroma's, HunyuanVideo's, the FLUX copies': ``act_mlp`` between ``proj_mlp`` and
    ``proj_out``, a GELU or Ovis-Image's gated SiLU, :func:`.flux_block.mlp_activation`), its
    norm ``norm(width, 1, generator)`` and its attention ``attention(width, generator)``; a
    NoMatch where kiln does not take its activation."""
    act = flux_block.mlp_activation(module)
    if act is None:
        return NoMatch("block", "its act_mlp is neither torch's GELU nor a SiLU gating half of proj_mlp")
    d, mlp = module.proj_mlp.in_features, 8
    g = torch.Generator().manual_seed(0)
    children = {"norm": norm(d, 1, g), "proj_mlp": _linear(d, 2 * mlp if act == "swiglu" else mlp, g),
                "proj_out": _ProbeProjOut(d, mlp, g), "attn": attention(d, g)}
    params = {"mlp_hidden_dim": mlp} if act == "swiglu" else {}
    return d, g, act, _Swapped(module, params=params, children=children)


def single_block_match(model: str, act: str, factory: Callable) -> DitMatch:
    """The match of ``model``'s FLUX-form single block whose MLP activation is ``act``."""
    return DitMatch(f"{model} single block ({act} into proj_out's input, gated residual)", f"{act} + gated_residual",
                    act, factory)


# The forms of FLUX-like single blocks: FLUX's (two streams in, two out), Bria's (its
# attention's keyword arguments named as its transformer passes them), Bria FIBO's (one
# joined stream in and out).
_JOINED_ARGUMENTS = ("hidden_states", "temb", "image_rotary_emb", "joint_attention_kwargs")
_SINGLE_FORMS = {_FLUX_BLOCK_ARGUMENTS: flux_block.flux_single_block,
                 _FLUX_BLOCK_ARGUMENTS[:-1] + ("attention_kwargs",): flux_block.flux_single_block,
                 _JOINED_ARGUMENTS: flux_block.joined_single_block}


def classify_flux_single_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    arguments = tuple(inspect.signature(original).parameters)
    factory = _SINGLE_FORMS.get(arguments)
    if factory is None:
        return NoMatch("block", f"its forward takes {arguments}, none of FLUX's block arguments {tuple(_SINGLE_FORMS)}")
    probe = single_block_probe(module, _ProbeAdaLN, lambda d, g: _FluxProbeAttention(d, g, joint=False))
    if isinstance(probe, NoMatch):
        return probe
    d, g, act, swap = probe
    if factory is flux_block.joined_single_block:
        x = torch.randn(2, 8, d, generator=g)
        temb, rope = torch.randn(2, d, generator=g), 0.1 * torch.randn(d, generator=g)
        calls = [((x, temb, rope, None), {}), ((), dict(hidden_states=x, temb=temb, image_rotary_emb=rope))]
    else:
        calls = _flux_block_calls(d, g, adjacent=True)
    return _confirmed(single_block_match("flux", act, factory), original, factory(module, original), calls, [swap],
                      "FLUX's single-stream block")


# ---- Wan -------------------------------------------------------------------------------


def classify_wan_attention(module: torch.nn.Module, processor, fuse_norms: bool = True) -> Union[DitMatch, NoMatch]:
    """kiln's processor for a Wan self-attention, with the q/k norms in its launch where they
    are RMSNorms kiln computes (and ``fuse_norms``: kiln.patch's ops include ``rms_norm``),
    probed with tables whose cos and sin are unrelated at every column, so that it agrees
    only by reading the columns diffusers reads."""
    heads = getattr(module, "heads", None)
    to_q = getattr(module, "to_q", None)
    inner = getattr(to_q, "out_features", None)
    if not isinstance(heads, int) or not isinstance(inner, int) or heads <= 0 or inner % heads \
            or (inner // heads) % 2:
        return NoMatch("attention", f"its heads ({heads!r}) do not split its width {inner!r} into even head dims")
    head_dim = inner // heads
    g = torch.Generator().manual_seed(0)
    inner_kv = getattr(getattr(module, "to_k", None), "out_features", inner)
    children: Dict[str, torch.nn.Module] = {}
    if getattr(module, "fused_projections", False):
        children["to_qkv"] = _linear(_PROBE_DIM, inner + 2 * inner_kv, g)
    else:
        children.update(to_q=_linear(_PROBE_DIM, inner, g), to_k=_linear(_PROBE_DIM, inner_kv, g),
                        to_v=_linear(_PROBE_DIM, inner_kv, g))
    swaps = [_Swapped(module, children=children), _Swapped(module.to_out, children={"0": _linear(inner, _PROBE_DIM, g)})]
    s = 6
    x = torch.randn(2, s, _PROBE_DIM, generator=g)
    calls = []
    for batch in (1, 2):
        cos = torch.randn(batch, s, 1, head_dim, generator=g)
        sin = torch.randn(batch, s, 1, head_dim, generator=g)
        calls.append(((module, x), dict(rotary_emb=(cos, sin))))
    calls.append(((module, x), {}))
    processor_cls = _WAN_PROCESSORS[_processor_call(module)]
    why, fuse_norms = _fused_or_plain(module, processor, processor_cls, calls, swaps, ("norm_q", "norm_k"), g,
                                      fuse_norms)
    if why is not None:
        return NoMatch("attention", f"does not compute Wan's attention as kiln's processor does: {why}")
    return attention_match(fuse_norms, processor_cls, "wan attention (q/k rms_norm + rope)",
                           "wan attention (rope of q and k)", fused_op="rms_norm_rope")


class _WanProbeAttention(_ProbeMixer):
    """_ProbeMixer called as Wan's blocks call their attentions: the mask before the rotation."""

    def forward(self, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        return super().forward(hidden_states, encoder_hidden_states, rotary_emb, attention_mask)


def classify_wan_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    table = module.scale_shift_table
    if tuple(table.shape[:2]) != (1, 6):
        return NoMatch("block", f"its scale_shift_table is {list(table.shape)}, not Wan's [1, 6, D]")
    d = table.shape[2]
    for name in ("norm1", "norm2", "norm3"):
        norm = getattr(module, name)
        if not isinstance(norm, torch.nn.LayerNorm) or tuple(norm.normalized_shape) != (d,):
            return NoMatch("block", f"its {name} is not a LayerNorm over the hidden size")
    for name in ("norm1", "norm3"):
        if getattr(module, name).weight is not None:
            return NoMatch("block", f"its {name} has parameters; Wan's modulated norms have none")
    params = tuple(inspect.signature(original).parameters)
    needed = ("hidden_states", "encoder_hidden_states", "temb", "rotary_emb")
    kinds = {needed: "wan", needed + ("attention_mask",): "skyreels-v2",
             ("hidden_states", "encoder_hidden_states", "control_hidden_states", "temb", "rotary_emb"): "wan vace"}
    # SkyReels-V2's block: Wan's, its self-attention masked, its per-token rows [B, 6, S, D]. Wan
    # VACE's control block: Wan's over the control stream, with input and output projections.
    model = kinds.get(params)
    if model is None:
        return NoMatch("block", f"its forward takes {params}, not Wan's block arguments {needed}")
    g = torch.Generator().manual_seed(0)
    children = {"attn1": _WanProbeAttention(d, g), "attn2": _WanProbeAttention(d, g), "ffn": _ProbeFF(d, g)}
    h = torch.randn(2, 5, d, generator=g) + 0.5
    enc = torch.randn(2, 3, d, generator=g)
    rope = 0.1 * torch.randn(d, generator=g)
    per_sample = torch.randn(2, 6, d, generator=g)
    if model == "wan vace":
        for name in ("proj_in", "proj_out"):
            if isinstance(getattr(module, name, None), torch.nn.Module):
                children[name] = _linear(d, d, g)
        control = torch.randn(2, 5, d, generator=g) - 0.5
        calls = [((h, enc, control, per_sample, rope), {})]
    else:
        skyreels = model == "skyreels-v2"
        per_token = torch.randn(2, 6, 5, d, generator=g) if skyreels else torch.randn(2, 5, 6, d, generator=g)
        mask = () if not skyreels else ((torch.rand(1, 1, 5, 5, generator=g) > 0.5).float(),)
        calls = [((h, enc, per_sample, rope) + mask, {}), ((h, enc, per_token, rope) + mask, {})]
    params = {"scale_shift_table": torch.randn(1, 6, d, generator=g) / d ** 0.5}
    swaps = [_Swapped(module, params=params, children=children)]
    norm2 = module.norm2
    if norm2.weight is not None:
        swaps.append(_Swapped(norm2, params={"weight": 1 + 0.3 * torch.randn(d, generator=g)}
                              | ({"bias": 0.3 * torch.randn(d, generator=g)} if norm2.bias is not None else {})))
    factory = {"wan": wan_block.wan_block, "skyreels-v2": wan_block.skyreels_block,
               "wan vace": wan_block.vace_block}[model]
    match = DitMatch(f"{model} block (adaln, gated residual + norm seams)", wan_block.BLOCK_OPS, "adaln", factory)
    patched = factory(module, original)
    return _confirmed(match, original, patched, calls, swaps, "Wan's block seams")


def _modulated_norm_kind(nm: torch.nn.Module) -> Union[str, NoMatch]:
    """The norm an AdaLN module modulates, as kiln.adaln names it: "layer" (a LayerNorm, its
    weight and bias, if any, as modulated_norm takes them) or "rms"."""
    result = detect.classify_norm(nm, replace.original_forward(nm))
    if isinstance(result, NoMatch):
        return NoMatch("adaln", f"its norm {result.reason}")
    if result.factory is detect.forwards.layer_norm:
        return "layer"
    if result.op == "rms_norm" and result.factory is not detect.forwards.rms_norm_offset:
        return "rms"
    return NoMatch("adaln", f"its norm computes {result.kind}")


def _norm_width(nm: torch.nn.Module) -> Optional[int]:
    shape = detect._normalized_shape(nm)
    weight = getattr(nm, "weight", None)
    return shape[-1] if shape else (weight.shape[0] if isinstance(weight, torch.Tensor) else None)


def _adaln_parts(module: torch.nn.Module) -> Union[Tuple[str, Optional[int], int], NoMatch]:
    """An AdaLN module's norm kind (_modulated_norm_kind), its norm's width and its linear's
    outputs."""
    kind = _modulated_norm_kind(module.norm)
    if isinstance(kind, NoMatch):
        return kind
    return kind, _norm_width(module.norm), module.linear.out_features


def classify_adaln(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    parts = _adaln_parts(module)
    if isinstance(parts, NoMatch):
        return parts
    kind, d, out = parts
    if not d or out % d:
        return NoMatch("adaln", f"its linear's {out} outputs are not whole chunks of the norm's width {d}")
    layouts = {6: ["zero"], 3: ["zero_single"], 2: ["continuous", "shift_scale"]}.get(out // d)
    if layouts is None:
        return NoMatch("adaln", f"its linear makes {out // d} chunks; kiln knows AdaLN layouts of 6, 3 and 2")
    params = inspect.signature(original).parameters
    # Two chunks: AdaLayerNormContinuous's (conditioning_embedding) or AdaLayerNorm's (temb).
    named = [layout for layout in layouts if flux.ADALN_LAYOUTS[layout][1] in params]
    if not named:
        return NoMatch("adaln", f"its forward takes no {flux.ADALN_LAYOUTS[layouts[0]][1]!r}")
    layout = named[0]
    emb_name = flux.ADALN_LAYOUTS[layout][1]
    if getattr(module, "emb", None) is not None:
        return NoMatch("adaln", "it embeds the timestep itself (its emb module)")
    g = torch.Generator().manual_seed(0)
    lin = _linear(16, out, g, bias=getattr(module.linear, "bias", None) is not None)
    x = torch.randn(2, 5, d, generator=g) + 0.5
    calls = [((x,), {emb_name: torch.randn(2, 16, generator=g)})]
    factory = flux.adaln_module(layout, kind)
    swaps = [_Swapped(module, children={"linear": lin})] + _norm_weights(module, ("norm",), g)
    match = DitMatch(f"adaln ({'layer' if kind == 'layer' else 'rms'} norm, {layout.replace('_', ' ')})", "adaln",
                     "adaln", factory)
    return _confirmed(match, original, factory(module, original), calls, swaps,
                      f"norm(x) * (1 + scale) + shift with {layout} chunks", what="adaln")


def layer_norm_zero_candidate(module: torch.nn.Module) -> bool:
    """CogVideoX's CogVideoXLayerNormZero: an AdaLN module of the video and the text tokens."""
    if not adaln_candidate(module):
        return False
    try:
        params = tuple(inspect.signature(replace.original_forward(module)).parameters)
    except (TypeError, ValueError):
        return False
    return params == ("hidden_states", "encoder_hidden_states", "temb")


def classify_layer_norm_zero(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    parts = _adaln_parts(module)
    if isinstance(parts, NoMatch):
        return parts
    kind, d, out = parts
    if not d or out != 6 * d:
        return NoMatch("adaln", f"its linear's {out} outputs are not 6 chunks of the norm's width {d}")
    g = torch.Generator().manual_seed(0)
    lin = _linear(16, out, g, bias=getattr(module.linear, "bias", None) is not None)
    calls = [((torch.randn(2, 5, d, generator=g) + 0.5, torch.randn(2, 3, d, generator=g) - 0.25,
               torch.randn(2, 16, generator=g)), {})]
    factory = flux.layer_norm_zero(kind)
    swaps = [_Swapped(module, children={"linear": lin})] + _norm_weights(module, ("norm",), g)
    match = DitMatch(f"adaln ({kind} norm, cogvideox video and text)", "adaln", "adaln", factory)
    return _confirmed(match, original, factory(module, original), calls, swaps,
                      "CogVideoX's norm(x) * (1 + scale) + shift of video and text", what="adaln")


# ---- CogVideoX --------------------------------------------------------------------------


_COGVIDEOX_BLOCK_ARGUMENTS = ("hidden_states", "encoder_hidden_states", "temb", "image_rotary_emb",
                              "attention_kwargs")


def cogvideox_block_candidate(module: torch.nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Module) for n in ("norm1", "attn1", "norm2", "ff")) \
        and layer_norm_zero_candidate(module.norm2)


class _ProbeLayerNormZero(torch.nn.Module):
    """A stand-in for CogVideoX's norm1: both streams transformed, and two [B, 1, D] gates
    from temb."""

    def __init__(self, dim: int, temb: int, g: torch.Generator):
        super().__init__()
        self.w, self.c = torch.randn(dim, generator=g), torch.randn(dim, generator=g)
        self.gates = torch.randn(2, temb, dim, generator=g) / temb ** 0.5

    def forward(self, hidden_states, encoder_hidden_states, temb):
        gate, enc_gate = (torch.tanh(temb @ m)[:, None, :] for m in self.gates)
        return torch.tanh(hidden_states * self.w), torch.tanh(encoder_hidden_states * self.c), gate, enc_gate


def classify_cogvideox_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    norm = module.norm2.norm
    if type(norm) is not torch.nn.LayerNorm or len(norm.normalized_shape) != 1:
        return NoMatch("block", "its norm2's norm is not a LayerNorm over the last dimension")
    if tuple(inspect.signature(original).parameters) != _COGVIDEOX_BLOCK_ARGUMENTS:
        return NoMatch("block", f"its forward does not take CogVideoX's block arguments {_COGVIDEOX_BLOCK_ARGUMENTS}")
    d, temb = norm.normalized_shape[0], 16
    g = torch.Generator().manual_seed(0)
    children = {"norm1": _ProbeLayerNormZero(d, temb, g), "attn1": _FluxProbeAttention(d, g, joint=True),
                "ff": _ProbeFF(d, g)}
    norm2 = module.norm2
    lin = _linear(temb, 6 * d, g, bias=getattr(norm2.linear, "bias", None) is not None)
    swaps = [_Swapped(module, children=children), _Swapped(norm2, children={"linear": lin})] \
        + _norm_weights(norm2, ("norm",), g)
    calls = [((torch.randn(2, 5, d, generator=g) + 0.5, torch.randn(2, 3, d, generator=g) - 0.25,
               torch.randn(2, temb, generator=g)), {})]
    patched = cogvideox_block.cogvideox_block(module, original)
    match = DitMatch("cogvideox block (gated residual + norm seams)", cogvideox_block.BLOCK_OPS, "adaln",
                     cogvideox_block.cogvideox_block)
    return _confirmed(match, original, patched, calls, swaps, "CogVideoX's block seams")


# Tried in this order; the first candidate test that holds decides the classifier.
CANDIDATES = (
    (video_rope_candidate, classify_video_rope),
    (ltx_attention_candidate, classify_ltx_attention),
    (flux_attention_candidate, classify_flux_attention),
    (wan_attention_candidate, classify_wan_attention),
    (ltx_block_candidate, classify_ltx_block),
    (wan_block_candidate, classify_wan_block),
    (flux_double_block_candidate, classify_flux_double_block),
    (flux_single_block_candidate, classify_flux_single_block),
    (cogvideox_block_candidate, classify_cogvideox_block),
    (layer_norm_zero_candidate, classify_layer_norm_zero),
    (adaln_candidate, classify_adaln),
)
