"""Fake (meta) implementations of the norm ops: shapes and dtypes only, mirroring the real
implementations (new contiguous outputs of x's shape and dtype; the in-place op returns
nothing)."""

import torch


def _check_device(op, name, t, x):
    torch._check_value(
        t.device == x.device,
        lambda: f"kiln.{op}: {name}: expected device {x.device} (as x), got {t.device}",
    )


def _check_like(op, name, t, x):
    _check_device(op, name, t, x)
    torch._check_value(
        t.shape == x.shape,
        lambda: f"kiln.{op}: {name}: expected shape {list(x.shape)} (as x), got {list(t.shape)}",
    )
    torch._check_type(
        t.dtype == x.dtype,
        lambda: f"kiln.{op}: {name}: expected dtype {x.dtype} (as x), got {t.dtype}",
    )


def _check_parameter(op, name, p, x, dtype=None, like="x"):
    """A [D] row of x's dtype (or `dtype`, as `like`'s) on x's device."""
    if p is None:
        return
    _check_device(op, name, p, x)
    torch._check_value(
        p.dim() == 1 and p.shape[0] == x.shape[-1],
        lambda: f"kiln.{op}: {name}: expected shape [{x.shape[-1]}], got {list(p.shape)}",
    )
    expected = x.dtype if dtype is None else dtype
    torch._check_type(
        p.dtype == expected,
        lambda: f"kiln.{op}: {name}: expected dtype {expected} (as {like}), got {p.dtype}",
    )


def _check_modulation(op, name, m, x):
    torch._check_value(x.dim() == 3, lambda: f"kiln.{op}: x: expected shape [B, T, D], got {list(x.shape)}")
    _check_device(op, name, m, x)
    torch._check_value(
        m.dim() == 3 and m.shape[0] == x.shape[0] and m.shape[2] == x.shape[2],
        lambda: f"kiln.{op}: {name}: expected shape [B, 1, D] or [B, T, D], got {list(m.shape)}",
    )
    torch._check_type(
        m.dtype == x.dtype,
        lambda: f"kiln.{op}: {name}: expected dtype {x.dtype} (as x), got {m.dtype}",
    )


@torch.library.register_fake("kiln::rms_norm_gated")
def _rms_norm_gated_fake(x, gate, weight=None, eps=1e-6, activation="silu", norm_before_gate=True):
    _check_like("rms_norm_gated", "gate", gate, x)
    _check_parameter("rms_norm_gated", "weight", weight, x)
    torch._check_value(
        activation in ("silu", "sigmoid"),
        lambda: f'kiln.rms_norm_gated: activation: expected "silu" or "sigmoid", got "{activation}"',
    )
    return x.new_empty(x.shape)


@torch.library.register_fake("kiln::fused_add_rms_norm")
def _fused_add_rms_norm_fake(x, residual, weight, eps=1e-6):
    _check_like("fused_add_rms_norm", "residual", residual, x)
    _check_parameter("fused_add_rms_norm", "weight", weight, x)
    return x.new_empty(x.shape), x.new_empty(x.shape)


@torch.library.register_fake("kiln::fused_add_rms_norm_")
def _fused_add_rms_norm_inplace_fake(x, residual, weight, eps=1e-6):
    _check_like("fused_add_rms_norm_", "residual", residual, x)
    _check_parameter("fused_add_rms_norm_", "weight", weight, x)
    return None


@torch.library.register_fake("kiln::layer_norm")
def _layer_norm_fake(x, weight=None, bias=None, eps=1e-5):
    _check_parameter("layer_norm", "weight", weight, x)
    _check_parameter("layer_norm", "bias", bias, x)
    return x.new_empty(x.shape)


def _check_table_rows(op, rows, x):
    """Table rows (in the order the ops check them) all given or none, of x's dtype or all
    fp32 as table_scale is (diffusers keeps some scale_shift_tables in fp32)."""
    if all(p is None for _, p in rows):
        return
    reference = dict(rows)["table_scale"]
    f32 = reference is not None and reference.dtype == torch.float32 and x.dtype != torch.float32
    for name, p in rows:
        torch._check_value(p is not None, lambda: f"kiln.{op}: {name}: expected a [D] table row, since other "
                                                  "table rows are given, got None")
        _check_parameter(op, name, p, x, torch.float32 if f32 else None, "table_scale" if f32 else "x")


@torch.library.register_fake("kiln::adaln")
def _adaln_fake(x, scale, shift, weight=None, eps=1e-6, norm="rms", table_scale=None, table_shift=None):
    for name, m in (("scale", scale), ("shift", shift)):
        _check_modulation("adaln", name, m, x)
    _check_parameter("adaln", "weight", weight, x)
    _check_table_rows("adaln", (("table_scale", table_scale), ("table_shift", table_shift)), x)
    return x.new_empty(x.shape)


@torch.library.register_fake("kiln::gated_adaln")
def _gated_adaln_fake(
    h, y, gate, scale, shift, weight=None, eps=1e-6, norm="rms", table_gate=None, table_scale=None, table_shift=None
):
    _check_like("gated_adaln", "y", y, h)
    for name, m in (("gate", gate), ("scale", scale), ("shift", shift)):
        _check_modulation("gated_adaln", name, m, h)
    _check_parameter("gated_adaln", "weight", weight, h)
    _check_table_rows("gated_adaln", (("table_gate", table_gate), ("table_scale", table_scale),
                                      ("table_shift", table_shift)), h)
    return h.new_empty(h.shape), h.new_empty(h.shape)
