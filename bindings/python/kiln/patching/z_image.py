"""Z-Image's transformer (diffusers' ``ZImageTransformer2DModel``: Z-Image, Z-Image-Turbo and the
models built on its blocks): its attention processor, its feed-forward and its modulated blocks'
seams.

The attention RMS-normalises each head of q and k (weights of their own) and rotates them by
complex frequencies (adjacent pairs times one complex64 angle, in fp32): diffusers runs each of
the four as several kernels with fp32 and complex temporaries; kiln normalises and rotates q and
k in one ``kiln.head_norm_rope``, the frequencies' real and imaginary parts read as fp32 half
tables (made once a forward for all blocks), where the norms are RMSNorms kiln computes and no
graph is recorded; otherwise the norm modules and one ``kiln.rope``.

The feed-forward, ``w2(silu(w1(x)) * w3(x))``, gates in one ``kiln.swiglu``.

The modulated block (one stream; a [B, 4D] modulation of scale_msa, gate_msa, scale_mlp,
gate_mlp, the gates through tanh; each sublayer's output normalised before its gated residual):

* ``attention_norm1(x) * (1 + scale_msa)`` -> one ``kiln.adaln`` (the norm's weight in the call);
* ``x + tanh(gate_msa) * attention_norm2(attn)`` then ``ffn_norm1(x) * (1 + scale_mlp)`` -> one
  ``kiln.gated_adaln`` (attention_norm2 is the module's own, a ``kiln.rms_norm`` where patched);
* ``x + tanh(gate_mlp) * ffn_norm2(ff)`` -> one ``kiln.gated_residual_``.

Per-token modulation (``noise_mask``: the noisy and the clean tokens' embeddings) is selected as
diffusers selects it and read per token. Each seam is rounded once to x's dtype where diffusers
rounds after each product and sum. The blocks without modulation (the caption refiner's) keep
diffusers' forward, as does anything kiln does not take (autograd, hooks on the norms, a norm
kiln does not compute) and torch.compile's tracing, where Inductor fuses the seams itself.
"""

import sys
from typing import Callable, Optional

import torch

from .. import activation_ops, norm_ops, rope_ops
from .forwards import (SharedAttentionSettings, any_hooks, fused_head_norms, kiln_can_take, norm_eps,
                       records_parameters, runs_probed_activation, signature_kept)
from .ltx import constant
from .per_forward import OncePerForward

BLOCK_OPS = "adaln + gated_adaln + gated_residual"


def _parts(freqs: torch.Tensor):
    return freqs.real.contiguous(), freqs.imag.contiguous()


_TABLES = OncePerForward(_parts)


def _tables(freqs, q: torch.Tensor):
    """(cos, sin) fp32 half tables [B, S, D / 2] of complex64 frequencies for q [B, S, H, D], or None."""
    if not (isinstance(freqs, torch.Tensor) and freqs.dtype == torch.complex64 and freqs.dim() == 3
            and freqs.device == q.device and q.dim() == 4 and freqs.shape[0] in (1, q.shape[0])
            and freqs.shape[1] == q.shape[1] and 2 * freqs.shape[2] == q.shape[3]):
        return None
    if torch.is_grad_enabled() and freqs.requires_grad:
        return None
    return _TABLES.get(freqs)


@signature_kept
class ZImageAttnProcessor(SharedAttentionSettings):
    """diffusers' ``ZSingleStreamAttnProcessor.__call__`` with the q/k norms and rotation in kiln's
    launches (see the module's docstring); the projections and the attention are diffusers'."""

    def __init__(self, original: object, fuse_norms: bool = False):
        self.original = original
        # The module's q/k norms are RMSNorms one kiln call computes (checked when patched).
        self.fuse_norms = fuse_norms
        self._dispatch = sys.modules[type(original).__module__].dispatch_attention_fn

    def _fused(self, attn, query, key, freqs_cis):
        """norm_q, norm_k and the rotation as one kiln.head_norm_rope, or None."""
        if not self.fuse_norms or freqs_cis is None or query.shape != key.shape:
            return None
        norms = fused_head_norms((attn.norm_q, attn.norm_k), query, key)
        tables = _tables(freqs_cis, query)
        if norms is None or tables is None:
            return None
        (wq, wk), eps = norms
        return rope_ops.head_norm_rope(query, key, wq, wk, *tables, eps, interleaved=True, rotary_dim=query.shape[3],
                                       layout="bshd")

    def _rotated(self, query, key, freqs_cis):
        tables = _tables(freqs_cis, query)
        if tables is not None and query.shape == key.shape and kiln_can_take(query, key, differentiable=True):
            return rope_ops.rope(query, key, *tables, interleaved=True, rotary_dim=query.shape[3], layout="bshd")
        return _diffusers_rotation(query, freqs_cis), _diffusers_rotation(key, freqs_cis)

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor] = None,
                 attention_mask: Optional[torch.Tensor] = None, freqs_cis: Optional[torch.Tensor] = None):
        query = attn.to_q(hidden_states).unflatten(-1, (attn.heads, -1))
        key = attn.to_k(hidden_states).unflatten(-1, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(-1, (attn.heads, -1))
        fused = self._fused(attn, query, key, freqs_cis)
        if fused is not None:
            query, key = fused
        else:
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
            if freqs_cis is not None:
                query, key = self._rotated(query, key, freqs_cis)
        if attention_mask is not None and attention_mask.ndim == 2:
            attention_mask = attention_mask[:, None, None, :]
        dtype = query.dtype
        hidden_states = self._dispatch(query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
                                       backend=self._attention_backend, parallel_config=self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).to(dtype)
        output = attn.to_out[0](hidden_states)
        if len(attn.to_out) > 1:
            output = attn.to_out[1](output)
        return output


def _diffusers_rotation(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """diffusers' rotation of x [B, S, H, D] by complex frequencies [B, S, D / 2], in fp32."""
    with torch.amp.autocast("cuda", enabled=False):
        rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2)) * freqs_cis.unsqueeze(2)
        return torch.view_as_real(rotated).flatten(3).type_as(x)


# ---- the feed-forward ------------------------------------------------------------------------

GATING = "_forward_silu_gating"


def feed_forward(module: torch.nn.Module, original: Callable) -> Callable:
    """``w2(silu(w1(x)) * w3(x))`` with the gating as one kiln.swiglu, where the module's gating
    method is still the one its probe confirmed."""

    def forward(*args, **kwargs):
        if len(args) != 1 or kwargs or not isinstance(args[0], torch.Tensor):
            return original(*args, **kwargs)
        x = args[0]
        gate, up = module.w1(x), module.w3(x)
        gating = getattr(module, GATING)
        if gate.shape == up.shape and runs_probed_activation(module, gating) \
                and kiln_can_take(gate, up, differentiable=True):
            return module.w2(activation_ops.swiglu(gate, up))
        return module.w2(gating(gate, up))

    return forward


# ---- the block -------------------------------------------------------------------------------

_NORMS = ("attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2")


def _per_token(noisy: torch.Tensor, clean: torch.Tensor, noise_mask: torch.Tensor, seq_len: int) -> torch.Tensor:
    """diffusers' select_per_token: the noisy tokens' values where noise_mask is 1, else the clean's."""
    return torch.where(noise_mask.unsqueeze(-1) == 1, noisy.unsqueeze(1).expand(-1, seq_len, -1),
                       clean.unsqueeze(1).expand(-1, seq_len, -1))


def _modulation(module, x, adaln_input, noise_mask, adaln_noisy, adaln_clean):
    """(scale_msa, gate_msa, scale_mlp, gate_mlp): the scales as the modulation gives them (kiln
    adds the 1), the gates through tanh; [B, 1, D], or per token [B, T, D] with noise_mask."""
    if noise_mask is None:
        scale_msa, gate_msa, scale_mlp, gate_mlp = module.adaLN_modulation(adaln_input).unsqueeze(1).chunk(4, dim=2)
        return scale_msa, gate_msa.tanh(), scale_mlp, gate_mlp.tanh()
    noisy = module.adaLN_modulation(adaln_noisy).chunk(4, dim=1)
    clean = module.adaLN_modulation(adaln_clean).chunk(4, dim=1)
    chosen = [_per_token(n, c, noise_mask, x.shape[1]) for n, c in zip(noisy, clean)]
    return chosen[0], chosen[1].tanh(), chosen[2], chosen[3].tanh()


def _fits(module, x, adaln_input, noise_mask, adaln_noisy, adaln_clean) -> bool:
    if torch.compiler.is_compiling() or not getattr(module, "modulation", False) or records_parameters(module):
        return False
    given = (adaln_input,) if noise_mask is None else (noise_mask, adaln_noisy, adaln_clean)
    if not (isinstance(x, torch.Tensor) and x.dim() == 3 and all(isinstance(t, torch.Tensor) for t in given)):
        return False
    d = x.shape[-1]
    for name in _NORMS:
        norm = getattr(module, name)
        weight = getattr(norm, "weight", None)
        if any_hooks(norm) or (weight is not None and (not isinstance(weight, torch.Tensor) or weight.shape != (d,)
                                                       or not kiln_can_take(x, weight))):
            return False
    return kiln_can_take(x)


def z_image_block(module: torch.nn.Module, original: Callable) -> Callable:
    """``ZImageTransformerBlock.forward`` with its seams fused (see the module's docstring)."""
    consts = {}

    def forward(x, attn_mask, freqs_cis, adaln_input=None, noise_mask=None, adaln_noisy=None, adaln_clean=None):
        if not _fits(module, x, adaln_input, noise_mask, adaln_noisy, adaln_clean):
            return original(x, attn_mask, freqs_cis, adaln_input, noise_mask, adaln_noisy, adaln_clean)
        scale_msa, gate_msa, scale_mlp, gate_mlp = _modulation(module, x, adaln_input, noise_mask, adaln_noisy,
                                                               adaln_clean)
        if not kiln_can_take(x, scale_msa, gate_msa):
            return original(x, attn_mask, freqs_cis, adaln_input, noise_mask, adaln_noisy, adaln_clean)
        d = x.shape[-1]
        zero = constant(consts, x, lambda: x.new_zeros(1, 1, d)).expand(x.shape[0], 1, d)
        n1, n2, f1, f2 = (getattr(module, name) for name in _NORMS)
        normed = norm_ops.adaln(x, scale_msa, zero, getattr(n1, "weight", None), norm_eps(n1, x), "rms")
        attn_out = n2(module.attention(normed, attention_mask=attn_mask, freqs_cis=freqs_cis))
        if attn_out.shape == x.shape and kiln_can_take(x, attn_out):
            x, normed = norm_ops.gated_adaln(x, attn_out, gate_msa, scale_mlp, zero, getattr(f1, "weight", None),
                                             norm_eps(f1, x), "rms")
        else:
            x = x + gate_msa * attn_out
            normed = f1(x) * (1.0 + scale_mlp)
        ff_out = f2(module.feed_forward(normed))
        if ff_out.shape == x.shape and kiln_can_take(x, ff_out):
            return activation_ops.gated_residual_(x, ff_out, gate_mlp)
        return x + gate_mlp * ff_out

    return forward
