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
