"""Fake (meta) implementations: shapes and dtypes only, so torch.compile and FakeTensor
tracing see kiln's ops without running them. They mirror the real implementations'
output rules: a new contiguous tensor of x's shape and dtype."""

import torch


@torch.library.register_fake("kiln::rms_norm")
def _rms_norm_fake(x, weight=None, eps=1e-6):
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
    return x.new_empty(x.shape)
