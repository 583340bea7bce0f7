"""Higher-precision references the tests compare kiln with."""

import torch

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def rms_norm_fp64(x, weight, eps):
    x64 = x.double()
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    return y


def assert_close_to(out, ref, dtype):
    """Element-wise, relative to max(1, |ref|): one rounding of the output dtype plus fp32
    math; NaN never passes."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert not torch.isnan(out).any(), "output has NaN (unwritten or poisoned elements)"
    err = (out.double() - ref).abs() / ref.abs().clamp_min(1.0)
    worst = err.max().item() if err.numel() else 0.0
    assert worst <= TOLERANCE[dtype], f"max relative error {worst:.3e} > {TOLERANCE[dtype]:.1e}"


def fused_add_rms_norm_fp64(x, residual, weight, eps):
    """(rms_norm(r), r) for r = x + residual, in fp64. The op rounds r to x's dtype (it
    returns r in that dtype) and normalises what it returns, so the norm is taken of r
    rounded once, as the eager composition does."""
    r = x.double() + residual.double()
    return rms_norm_fp64(r.to(x.dtype), weight, eps), r


def layer_norm_fp64(x, weight, bias, eps):
    x64 = x.double()
    centred = x64 - x64.mean(-1, keepdim=True)
    y = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y


def adaln_fp64(x, scale, shift, weight=None, eps=1e-6, norm="rms", table_scale=None, table_shift=None):
    """norm(x) [* weight] * (1 + scale) + shift, in fp64 (diffusers' DiT modulation)."""
    n = rms_norm_fp64(x, weight, eps) if norm == "rms" else layer_norm_fp64(x, weight, None, eps)
    scale, shift = scale.double(), shift.double()
    if table_scale is not None:
        scale = scale + table_scale.double()
        shift = shift + table_shift.double()
    return n * (1 + scale) + shift


def gated_adaln_fp64(h, y, gate, scale, shift, weight=None, eps=1e-6, norm="rms", table_gate=None, table_scale=None, table_shift=None):
    """(h2, adaln(h2)) for h2 = h + y * gate, in fp64; the norm is taken of h2 rounded to
    h's dtype, the residual stream the op returns (see fused_add_rms_norm_fp64)."""
    g = gate.double() + (table_gate.double() if table_gate is not None else 0)
    h2 = h.double() + y.double() * g
    return h2, adaln_fp64(h2.to(h.dtype), scale, shift, weight, eps, norm, table_scale, table_shift)


def rms_norm_gated_fp64(x, gate, weight, eps, activation="silu", norm_before_gate=True):
    """rms_norm(x, weight) * silu(gate) (or * sigmoid(gate)), in fp64: the norm before the gate,
    as Qwen3-Next's RMSNormGated computes it; or rms_norm(x * silu(gate), weight), Mamba-2's."""
    z = gate.double()
    g = torch.nn.functional.silu(z) if activation == "silu" else torch.sigmoid(z)
    if not norm_before_gate:
        return rms_norm_fp64(x.double() * g, weight, eps)
    return rms_norm_fp64(x, weight, eps) * g
