"""HunyuanVideo's and HunyuanImage's patterns (:mod:`.hunyuan_video`), each confirmed on a probe as
:mod:`.detect_dit`'s are: its attentions (found by their processors' ``__call__``) and its
double- and single-stream blocks (found by their children and their forwards' arguments, which
FLUX's blocks do not share)."""

import inspect
from typing import Callable, Union

import torch

from . import flux_block, hunyuan_video
from .detect import NoMatch, _Swapped
from .detect_dit import (_PROBE_DIM, DitMatch, attention_match, _confirmed, _fused_or_plain, _linear, _ProbeAdaLN,
                         _ProbeFF, _ProbeMixer, _processor_call, double_block_width, single_block_match,
                         single_block_probe)
from .detect_flux2 import _takes

# HunyuanImage's double block names its rotation image_rotary_emb.
_DOUBLE_ARGUMENTS = [("hidden_states", "encoder_hidden_states", "temb", "attention_mask", rope, "args", "kwargs")
                     for rope in ("freqs_cis", "image_rotary_emb")]
_SINGLE_ARGUMENTS = ("hidden_states", "encoder_hidden_states", "temb", "attention_mask", "image_rotary_emb", "args",
                     "kwargs")
_PROCESSORS = {"HunyuanVideoAttnProcessor2_0.__call__": hunyuan_video.HunyuanVideoAttnProcessor,
               "HunyuanImageAttnProcessor.__call__": hunyuan_video.HunyuanVideoAttnProcessor,
               "HunyuanVideo15AttnProcessor2_0.__call__": hunyuan_video.HunyuanVideo15AttnProcessor}


def attention_candidate(module: torch.nn.Module) -> bool:
    return _processor_call(module) in _PROCESSORS


def double_block_candidate(module: torch.nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Module)
               for n in ("norm1", "norm1_context", "attn", "norm2", "norm2_context", "ff", "ff_context")) \
        and any(_takes(module, arguments) for arguments in _DOUBLE_ARGUMENTS)


def single_block_candidate(module: torch.nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Module)
               for n in ("norm", "proj_mlp", "act_mlp", "proj_out", "attn")) \
        and isinstance(getattr(module.proj_mlp, "in_features", None), int) and _takes(module, _SINGLE_ARGUMENTS)


def _probe_calls(module: torch.nn.Module, version_15: bool, head_dim: int, g: torch.Generator):
    """Probe calls of the attention: 6 video and 3 text tokens (the text with a padded mask), the
    video's rotation table interleaved pairs; the single-stream form also with both inputs the
    halves of one tensor, as its block passes them."""
    x = torch.randn(2, 6, _PROBE_DIM, generator=g)
    enc = torch.randn(2, 3, _PROBE_DIM, generator=g)
    angles = 40 * torch.randn(6, head_dim // 2, generator=g)
    rope = (angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1))
    valid = torch.tensor([[True, True, True], [True, True, False]])
    if version_15:
        return [((module, x), dict(encoder_hidden_states=enc, attention_mask=valid.long(), image_rotary_emb=rope))]
    mask = torch.cat([torch.ones(2, 6, dtype=torch.bool), valid], dim=1)[:, None, None, :]
    calls = [((module, x), dict(encoder_hidden_states=enc, attention_mask=mask, image_rotary_emb=rope)),
             ((module, x), dict(encoder_hidden_states=enc, image_rotary_emb=rope))]
    if module.add_q_proj is None:
        both = torch.cat([x, enc], dim=1)
        calls.append(((module, both[:, :6]), dict(encoder_hidden_states=both[:, 6:], attention_mask=mask,
                                                  image_rotary_emb=rope)))
    return calls


def classify_attention(module: torch.nn.Module, processor, fuse_norms: bool = True) -> Union[DitMatch, NoMatch]:
    """kiln's processor for a HunyuanVideo attention, with the video tokens' per-head q/k norms
    in its launch where they are RMSNorms kiln computes (and ``fuse_norms``: kiln.patch's ops
    include ``rms_norm``)."""
    heads, inner = getattr(module, "heads", None), getattr(module, "inner_dim", None)
    if not isinstance(heads, int) or not isinstance(inner, int) or heads <= 0 or inner % heads or (inner // heads) % 2:
        return NoMatch("attention", f"its heads ({heads!r}) do not split its width {inner!r} into even head dims")
    name = _processor_call(module)
    processor_cls = _PROCESSORS[name]
    g = torch.Generator().manual_seed(0)
    joint = getattr(module, "add_q_proj", None) is not None
    children = {n: _linear(_PROBE_DIM, inner, g)
                for n in ("to_q", "to_k", "to_v") + (("add_q_proj", "add_k_proj", "add_v_proj") if joint else ())}
    if isinstance(getattr(module, "to_add_out", None), torch.nn.Module):
        children["to_add_out"] = _linear(inner, _PROBE_DIM, g)
    swaps = [_Swapped(module, children=children)]
    if isinstance(getattr(module, "to_out", None), torch.nn.ModuleList):
        swaps.append(_Swapped(module.to_out, children={"0": _linear(inner, _PROBE_DIM, g)}))
    calls = _probe_calls(module, processor_cls is hunyuan_video.HunyuanVideo15AttnProcessor, inner // heads, g)
    norms = ("norm_q", "norm_k") + (("norm_added_q", "norm_added_k") if joint else ())
    why, fused = _fused_or_plain(module, processor, processor_cls, calls, swaps, norms, g, fuse_norms)
    if why is not None:
        return NoMatch("attention", f"does not compute HunyuanVideo's attention as kiln's processor does: {why}")
    return attention_match(fused, processor_cls,
                           "hunyuan-video attention (per-head q/k rms_norm + rope of the video tokens)",
                           "hunyuan-video attention (rope of the video tokens' q and k)")


class _ProbeAttention(_ProbeMixer):
    """_ProbeMixer called as HunyuanVideo's blocks call their attentions: the video and the text
    stream in, both out."""

    def __init__(self, dim: int, g: torch.Generator):
        super().__init__(dim, g)
        self.c = torch.randn(dim, generator=g)

    def forward(self, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        y = super().forward(hidden_states, None, image_rotary_emb, attention_mask)
        return y, torch.tanh(encoder_hidden_states * self.c)


def _block_calls(original: Callable, d: int, g: torch.Generator, adjacent: bool):
    """Probe calls of a block: 5 video and 3 text tokens of width d, the mask and rotation passed
    by position and by name; with `adjacent`, one more whose streams are the two halves of one
    tensor."""
    h = torch.randn(2, 5, d, generator=g) + 0.5
    c = torch.randn(2, 3, d, generator=g) - 0.5
    temb, rope = torch.randn(2, d, generator=g), 0.1 * torch.randn(d, generator=g)
    mask = torch.rand(2, 1, 1, 8, generator=g)
    rope_name = tuple(inspect.signature(original).parameters)[4]
    calls = [((h, c, temb, mask, rope), {}), ((h, c, temb), {}),
             ((h, c, temb), {"attention_mask": mask, rope_name: rope})]
    if adjacent:
        both = torch.randn(2, 8, d, generator=g)
        calls.append(((both[:, :5], both[:, 5:], temb, mask, rope), {}))
    return calls


def classify_double_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    d = double_block_width(module, "HunyuanVideo")
    if isinstance(d, NoMatch):
        return d
    g = torch.Generator().manual_seed(0)
    children = {"norm1": _ProbeAdaLN(d, 4, g), "norm1_context": _ProbeAdaLN(d, 4, g), "attn": _ProbeAttention(d, g),
                "ff": _ProbeFF(d, g), "ff_context": _ProbeFF(d, g)}
    match = DitMatch("hunyuan-video double block (gated residual + norm seams)", flux_block.DOUBLE_OPS, "adaln",
                     hunyuan_video.double_block)
    return _confirmed(match, original, hunyuan_video.double_block(module, original),
                      _block_calls(original, d, g, False), [_Swapped(module, children=children)],
                      "HunyuanVideo's double-stream block seams")


def classify_single_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    probe = single_block_probe(module, _ProbeAdaLN, _ProbeAttention)
    if isinstance(probe, NoMatch):
        return probe
    d, g, act, swap = probe
    return _confirmed(single_block_match("hunyuan-video", act, hunyuan_video.single_block), original,
                      hunyuan_video.single_block(module, original), _block_calls(original, d, g, True), [swap],
                      "HunyuanVideo's single-stream block")


CANDIDATES = (
    (attention_candidate, classify_attention),
    (double_block_candidate, classify_double_block),
    (single_block_candidate, classify_single_block),
)
