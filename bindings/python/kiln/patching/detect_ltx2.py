"""LTX-2's patterns (:mod:`.ltx2`), each confirmed on a probe as :mod:`.detect_dit`'s are: its
attention (found by its processor's ``__call__``) and its audio-video transformer block (found
by its two streams' norms, attentions and tables)."""

import inspect
from typing import Callable, Union

import torch

from . import ltx2
from .detect import NoMatch, _Swapped
from .detect_dit import (_PROBE_DIM, DitMatch, attention_match, _confirmed, _fused_or_plain, _linear, _norm_weights,
                         _ProbeFF, _processor_call, _rms_norm_children)

_BLOCK_CHILDREN = ("norm1", "attn1", "audio_norm1", "audio_attn1", "norm2", "attn2", "audio_norm2", "audio_attn2",
                   "audio_to_video_norm", "audio_to_video_attn", "video_to_audio_norm", "video_to_audio_attn",
                   "norm3", "ff", "audio_norm3", "audio_ff")
_NORMS = ("norm1", "audio_norm1", "norm2", "audio_norm2", "audio_to_video_norm", "video_to_audio_norm", "norm3",
          "audio_norm3")
_ATTENTIONS = ("attn1", "audio_attn1", "attn2", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")
_BLOCK_ARGUMENTS = ("hidden_states", "audio_hidden_states", "encoder_hidden_states", "audio_encoder_hidden_states",
                    "temb", "temb_audio", "temb_ca_scale_shift", "temb_ca_audio_scale_shift", "temb_ca_gate",
                    "temb_ca_audio_gate", "temb_prompt", "temb_prompt_audio", "video_rotary_emb", "audio_rotary_emb",
                    "ca_video_rotary_emb", "ca_audio_rotary_emb", "encoder_attention_mask",
                    "audio_encoder_attention_mask", "self_attention_mask", "audio_self_attention_mask",
                    "a2v_cross_attention_mask", "v2a_cross_attention_mask", "use_a2v_cross_attention",
                    "use_v2a_cross_attention", "perturbation_mask", "all_perturbed")


# diffusers' processors and kiln's for each: LTX-2.3's perturbed one (spatio-temporal guidance) too.
_PROCESSORS = {"LTX2AudioVideoAttnProcessor.__call__": ltx2.LTX2AttnProcessor,
               "LTX2PerturbedAttnProcessor.__call__": ltx2.LTX2PerturbedAttnProcessor}


def attention_candidate(module: torch.nn.Module) -> bool:
    return _processor_call(module) in _PROCESSORS


def block_candidate(module: torch.nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Module) for n in _BLOCK_CHILDREN) \
        and callable(getattr(module, "get_mod_params", None)) \
        and isinstance(getattr(module, "audio_scale_shift_table", None), torch.Tensor)


def _probe_table(style: str, batch: int, tokens: int, heads: int, width: int, g: torch.Generator):
    """A (cos, sin) pair shaped as diffusers' LTX-2 rotary embedding makes it for ``style``."""
    angles = 40 * torch.randn(batch, tokens, width // 2, generator=g)
    if style == "interleaved":
        return angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    rows = angles.reshape(batch, tokens, heads, -1)
    return rows.cos().swapaxes(1, 2), rows.sin().swapaxes(1, 2)


def classify_attention(module: torch.nn.Module, processor, fuse_norms: bool = True) -> Union[DitMatch, NoMatch]:
    """kiln's processor for an LTX-2 attention, with the q/k norms in the rotation's launch where
    the rotation is interleaved and they are RMSNorms kiln computes (and ``fuse_norms``)."""
    style, heads = getattr(module, "rope_type", None), getattr(module, "heads", None)
    inner, inner_kv = getattr(module, "inner_dim", None), getattr(module, "inner_kv_dim", None)
    if style not in ("interleaved", "split"):
        return NoMatch("attention", f"its rope_type {style!r} is neither 'interleaved' nor 'split'")
    if not all(isinstance(v, int) and v > 0 for v in (heads, inner, inner_kv)) or inner % (2 * heads) \
            or inner_kv != inner:
        return NoMatch("attention", f"its heads ({heads!r}) do not split its widths ({inner!r}, {inner_kv!r}) into "
                                    "even head dims of one width")
    g = torch.Generator().manual_seed(0)
    children = {"to_q": _linear(_PROBE_DIM, inner, g), "to_k": _linear(_PROBE_DIM, inner, g),
                "to_v": _linear(_PROBE_DIM, inner, g)}
    if isinstance(getattr(module, "to_gate_logits", None), torch.nn.Module):
        children["to_gate_logits"] = _linear(_PROBE_DIM, heads, g)
    swaps = [_Swapped(module, children=children), _Swapped(module.to_out, children={"0": _linear(inner, _PROBE_DIM, g)})]
    x = torch.randn(2, 6, _PROBE_DIM, generator=g)
    enc = torch.randn(2, 4, _PROBE_DIM, generator=g)
    mask = torch.zeros(2, 1, 4)
    mask[1, :, 3:] = -10000.0
    own = _probe_table(style, 2, 6, heads, inner, g)
    calls = [((module, x), dict(query_rotary_emb=own)),
             ((module, x), dict(encoder_hidden_states=enc, query_rotary_emb=_probe_table(style, 2, 6, heads, inner, g),
                                key_rotary_emb=_probe_table(style, 2, 4, heads, inner, g))),
             ((module, x), dict(encoder_hidden_states=enc, attention_mask=mask))]
    kiln_processor = _PROCESSORS[_processor_call(module)]
    if kiln_processor is ltx2.LTX2PerturbedAttnProcessor:
        calls += [((module, x), dict(query_rotary_emb=own, perturbation_mask=torch.tensor([0.0, 1.0])[:, None, None])),
                  ((module, x), dict(query_rotary_emb=own, perturbation_mask=torch.zeros(2, 1, 1)))]
    why, fused = _fused_or_plain(module, processor, kiln_processor, calls, swaps, ("norm_q", "norm_k"), g,
                                 fuse_norms and style == "interleaved")
    if why is not None:
        return NoMatch("attention", f"does not compute LTX-2's attention as kiln's processor does: {why}")
    return attention_match(fused, kiln_processor, "ltx2 attention (q/k rms_norm + interleaved rope)",
                           f"ltx2 attention ({style} rope of q and k)", fused_op="rms_norm_rope",
                           fused_family="rms_norm_rope")


class _ProbeAttention(torch.nn.Module):
    """A stand-in for an LTX-2 attention: elementwise in its queries, and every argument it is
    given changes its output."""

    def __init__(self, dim: int, g: torch.Generator):
        super().__init__()
        self.w, self.b = torch.randn(dim, generator=g), torch.randn(dim, generator=g)

    def forward(self, hidden_states, encoder_hidden_states=None, attention_mask=None, query_rotary_emb=None,
                key_rotary_emb=None, perturbation_mask=None, all_perturbed=None):
        y = torch.tanh(hidden_states * self.w + self.b)
        for extra in (encoder_hidden_states, attention_mask, *(query_rotary_emb or ()), *(key_rotary_emb or ())):
            if extra is not None:
                y = y + extra.mean() * self.b
        return y


def classify_block(module: torch.nn.Module, original: Callable) -> Union[DitMatch, NoMatch]:
    why = _rms_norm_children(module, _NORMS, "block")
    if why is not None:
        return why
    if tuple(inspect.signature(original).parameters) != _BLOCK_ARGUMENTS:
        return NoMatch("block", f"its forward does not take LTX-2's block arguments {_BLOCK_ARGUMENTS}")
    nv, d = module.scale_shift_table.shape
    na, da = module.audio_scale_shift_table.shape
    g = torch.Generator().manual_seed(0)
    widths = {"attn1": d, "attn2": d, "audio_to_video_attn": d, "audio_attn1": da, "audio_attn2": da,
              "video_to_audio_attn": da}
    children = {name: _ProbeAttention(widths[name], g) for name in _ATTENTIONS}
    children.update(ff=_ProbeFF(d, g), audio_ff=_ProbeFF(da, g))
    params = {"scale_shift_table": torch.randn(nv, d, generator=g) / d ** 0.5,
              "audio_scale_shift_table": torch.randn(na, da, generator=g) / da ** 0.5,
              "video_a2v_cross_attn_scale_shift_table": 0.3 * torch.randn(5, d, generator=g),
              "audio_a2v_cross_attn_scale_shift_table": 0.3 * torch.randn(5, da, generator=g)}
    prompt = bool(getattr(module, "cross_attn_adaln", False))
    if prompt:
        params.update(prompt_scale_shift_table=0.3 * torch.randn(2, d, generator=g),
                      audio_prompt_scale_shift_table=0.3 * torch.randn(2, da, generator=g))
    swaps = [_Swapped(module, params=params, children=children)] + _norm_weights(module, _NORMS, g)

    def inputs(tokens_temb: int, **flags):
        r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
        given = dict(hidden_states=r(2, 5, d) + 0.5, audio_hidden_states=r(2, 3, da) - 0.5,
                     encoder_hidden_states=r(2, 4, d), audio_encoder_hidden_states=r(2, 4, da),
                     temb=r(2, tokens_temb, nv * d), temb_audio=r(2, 1, na * da),
                     temb_ca_scale_shift=r(2, 1, 4 * d), temb_ca_audio_scale_shift=r(2, 1, 4 * da),
                     temb_ca_gate=r(2, 1, d), temb_ca_audio_gate=r(2, 1, da),
                     video_rotary_emb=(r(d), r(d)), audio_rotary_emb=(r(da), r(da)),
                     ca_video_rotary_emb=(r(d), r(d)), ca_audio_rotary_emb=(r(da), r(da)),
                     encoder_attention_mask=r(2, 1, 4))
        if prompt:
            given.update(temb_prompt=r(2, 1, 2 * d), temb_prompt_audio=r(2, 1, 2 * da))
        given.update(flags)
        return (), given

    calls = [inputs(1), inputs(5), inputs(1, use_a2v_cross_attention=False),
             inputs(1, use_v2a_cross_attention=False),
             inputs(1, use_a2v_cross_attention=False, use_v2a_cross_attention=False)]
    if prompt:
        calls.append(inputs(1, temb_prompt=None, temb_prompt_audio=None))
    patched = ltx2.ltx2_block(module, original)
    match = DitMatch("ltx2 block (adaln, gated residual + norm seams, two streams)", ltx2.BLOCK_OPS, "adaln",
                     ltx2.ltx2_block)
    return _confirmed(match, original, patched, calls, swaps, "LTX-2's block seams")


CANDIDATES = (
    (attention_candidate, classify_attention),
    (block_candidate, classify_block),
)
