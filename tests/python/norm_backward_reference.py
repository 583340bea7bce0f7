"""fp64 references for the norm backward ops: torch autograd through the fp64 forward
references of reference.py, so the gradients kiln computes in closed form are checked
against differentiation of the plain formulas."""

import torch

from reference import adaln_fp64, layer_norm_fp64, rms_norm_fp64

# Element-wise, relative to max(1, |ref|). The gradients are rounded once to the dtype like
# the forward outputs, but dx comes from two row reductions and the parameter gradients
# from sums over many rows, so fp32 gets a few more units in the last place.
TOLERANCE = {torch.float32: 5e-5, torch.float16: 4e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-10}


def _leaf(t):
    return None if t is None else t.detach().double().requires_grad_(True)


def _grads(out, dy, inputs):
    wanted = [t for t in inputs if t is not None]
    got = iter(torch.autograd.grad(out, wanted, dy.double()))
    return [None if t is None else next(got) for t in inputs]


def rms_norm_grads(dy, x, weight, eps):
    x64, w64 = _leaf(x), _leaf(weight)
    return _grads(rms_norm_fp64(x64, w64, eps), dy, [x64, w64])


def fused_add_rms_norm_grads(dy, dr, r, weight, eps):
    """(dx = dresidual, dweight) for the backward of (rms_norm(r), r) at r."""
    r64, w64 = _leaf(r), _leaf(weight)
    dr_norm, dw = _grads(rms_norm_fp64(r64, w64, eps), dy, [r64, w64])
    return dr_norm + dr.double(), dw


def layer_norm_grads(dy, x, weight, bias, eps):
    x64, w64, b64 = _leaf(x), _leaf(weight), _leaf(bias)
    return _grads(layer_norm_fp64(x64, w64, b64, eps), dy, [x64, w64, b64])


def adaln_grads(dy, x, scale, shift, weight, eps, norm, table_scale=None, table_shift=None):
    """(dx, dscale, dshift, dweight, dtable_scale, dtable_shift)."""
    leaves = [_leaf(t) for t in (x, scale, shift, weight, table_scale, table_shift)]
    x64, s64, sh64, w64, ts64, tsh64 = leaves
    out = adaln_fp64(x64, s64, sh64, w64, eps, norm, ts64, tsh64)
    return _grads(out, dy, leaves)


def assert_grad_close(got, ref, dtype, name=""):
    assert got is not None, f"{name}: no gradient"
    assert got.shape == ref.shape, (name, got.shape, ref.shape)
    assert got.dtype == dtype, (name, got.dtype, dtype)
    assert not torch.isnan(got).any(), f"{name}: NaN (unwritten or poisoned elements)"
    err = (got.double() - ref).abs() / ref.abs().clamp_min(1.0)
    worst = err.max().item() if err.numel() else 0.0
    assert worst <= TOLERANCE[dtype], f"{name}: max relative error {worst:.3e} > {TOLERANCE[dtype]:.1e}"
