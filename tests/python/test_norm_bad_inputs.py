"""Bad inputs to the norm ops: each a clear error naming the op, the argument, what was
expected and what was given."""

import pytest
import torch

import kiln


def test_fused_add_mismatched_residual():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"kiln.fused_add_rms_norm: residual: expected shape \[2, 8\] \(as x\), got \[2, 7\]"):
        kiln.fused_add_rms_norm(x, torch.randn(2, 7))
    with pytest.raises(TypeError, match=r"kiln.fused_add_rms_norm: residual: expected dtype float32 \(as x\), got bfloat16"):
        kiln.fused_add_rms_norm(x, torch.randn(2, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"kiln.fused_add_rms_norm_: residual: expected shape"):
        kiln.fused_add_rms_norm_(x, torch.randn(3, 8))


def test_fused_add_mismatched_devices():
    x = torch.randn(2, 8)
    meta = torch.empty(2, 8, device="meta")
    with pytest.raises(ValueError, match=r"kiln.fused_add_rms_norm: residual: expected device cpu \(as x\), got meta"):
        torch.ops.kiln.fused_add_rms_norm.default(x, meta, None, 1e-6)


def test_layer_norm_bad_parameters():
    x = torch.randn(2, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"kiln.layer_norm: bias: expected shape \[8\] \(x's last dimension\), got \[4\]"):
        kiln.layer_norm(x, None, torch.randn(4, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"kiln.layer_norm: weight: expected dtype float16 \(as x\), got float32"):
        kiln.layer_norm(x, torch.randn(8))
    with pytest.raises(TypeError, match=r"kiln.layer_norm: x: expected dtype float32, float16, bfloat16 or float64, got int32"):
        kiln.layer_norm(torch.ones(2, 8, dtype=torch.int32))


def test_adaln_broadcast_shape_neither_per_sample_nor_per_token():
    x = torch.randn(2, 5, 8)
    good = torch.randn(2, 1, 8)
    for bad in (torch.randn(2, 3, 8), torch.randn(1, 1, 8), torch.randn(2, 8), torch.randn(2, 5, 4)):
        with pytest.raises(ValueError, match=r"kiln.adaln: scale: expected shape \[2, 1, 8\] \(per sample\) or \[2, 5, 8\] \(per token\)"):
            kiln.adaln(x, bad, good)
    with pytest.raises(ValueError, match=r"kiln.gated_adaln: gate: expected shape \[2, 1, 8\] \(per sample\) or \[2, 5, 8\]"):
        kiln.gated_adaln(x, x, torch.randn(2, 2, 8), good, good)


def test_adaln_bad_x_norm_dtype_and_tables():
    x = torch.randn(2, 5, 8)
    m = torch.randn(2, 1, 8)
    with pytest.raises(ValueError, match=r"kiln.adaln: x: expected shape \[B, T, D\] with D > 0, got \[10, 8\]"):
        kiln.adaln(x.reshape(10, 8), m, m)
    with pytest.raises(ValueError, match=r"kiln.adaln: norm: expected \"rms\" or \"layer\", got \"group\""):
        kiln.adaln(x, m, m, norm="group")
    with pytest.raises(TypeError, match=r"kiln.adaln: shift: expected dtype float32 \(as x\), got float16"):
        kiln.adaln(x, m, m.half())
    with pytest.raises(ValueError, match=r"kiln.adaln: table_shift: expected a \[D\] table row, since other table rows are given, got None"):
        kiln.adaln(x, m, m, table_scale=torch.randn(8))
    with pytest.raises(ValueError, match=r"kiln.gated_adaln: y: expected shape \[2, 5, 8\] \(as h\), got \[2, 4, 8\]"):
        kiln.gated_adaln(x, torch.randn(2, 4, 8), m, m, m)
    with pytest.raises(ValueError, match=r"kiln.gated_adaln: table_gate: expected a \[D\] table row"):
        kiln.gated_adaln(x, x, m, m, m, table_scale=torch.randn(8), table_shift=torch.randn(8))
