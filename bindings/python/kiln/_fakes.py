"""Fake (meta) implementations: shapes and dtypes only, so torch.compile and FakeTensor
tracing see kiln's ops without running them. They mirror the real implementations'
output rules: a new contiguous tensor of x's shape and dtype."""

import torch


def _check_rms_norm(x, weight):
    torch._check(x.dim() >= 1, lambda: "kiln.rms_norm: x: expected at least 1 dimension")
    if weight is not None:
        torch._check(
            weight.dim() == 1 and weight.shape[0] == x.shape[-1],
            lambda: f"kiln.rms_norm: weight: expected shape [{x.shape[-1]}], got {list(weight.shape)}",
        )
        torch._check(
            weight.dtype == x.dtype,
            lambda: f"kiln.rms_norm: weight: expected dtype {x.dtype} (as x), got {weight.dtype}",
        )


@torch.library.register_fake("kiln::rms_norm")
def _rms_norm_fake(x, weight=None, eps=1e-6):
    _check_rms_norm(x, weight)
    return x.new_empty(x.shape)


def check_out(op, out, shape, like):
    """The out= overloads' rule: out has the result's shape and the inputs' dtype and device."""
    torch._check(out.dtype == like.dtype,
                 lambda: f"kiln.{op}: out: expected dtype {like.dtype} (the inputs'), got {out.dtype}")
    torch._check(out.device == like.device,
                 lambda: f"kiln.{op}: out: expected a tensor on {like.device}, got {out.device}")
    torch._check(list(out.shape) == list(shape),
                 lambda: f"kiln.{op}: out: expected shape {list(shape)}, got {list(out.shape)}")


@torch.library.register_fake("kiln::rms_norm.out")
def _rms_norm_out_fake(x, weight=None, eps=1e-6, *, out):
    _check_rms_norm(x, weight)
    check_out("rms_norm", out, x.shape, x)
