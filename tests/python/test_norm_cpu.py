"""The norm ops' CPU references (registered with torch) against fp64 math, their fakes under
torch.compile, opcheck, and the dtype rule. Runs everywhere (no GPU)."""

import pytest
import torch

import kiln
from reference import (
    adaln_fp64,
    assert_close_to,
    fused_add_rms_norm_fp64,
    gated_adaln_fp64,
    layer_norm_fp64,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def rand(*shape, dtype, gen, offset=0.0):
    return (torch.randn(*shape, generator=gen) + offset).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 64, 4545])
@pytest.mark.parametrize("rows", [1, 33])
@pytest.mark.parametrize("with_weight", [True, False])
def test_fused_add_rms_norm(dtype, hidden, rows, with_weight):
    gen = torch.Generator().manual_seed(hidden + rows)
    x, r = rand(rows, hidden, dtype=dtype, gen=gen), rand(rows, hidden, dtype=dtype, gen=gen, offset=0.5)
    w = rand(hidden, dtype=dtype, gen=gen) if with_weight else None
    out, s = kiln.fused_add_rms_norm(x, r, w, 1e-5)
    ref_out, ref_s = fused_add_rms_norm_fp64(x, r, w, 1e-5)
    assert out.dtype == dtype and s.dtype == dtype
    assert_close_to(s, ref_s, dtype)
    assert_close_to(out, ref_out, dtype)

    x2, r2 = x.clone(), r.clone()
    assert kiln.fused_add_rms_norm_(x2, r2, w, 1e-5) is None
    assert torch.equal(x2, out) and torch.equal(r2, s)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 64, 4545])
@pytest.mark.parametrize("rows", [1, 33])
@pytest.mark.parametrize("affine", ["none", "weight", "both"])
def test_layer_norm(dtype, hidden, rows, affine):
    gen = torch.Generator().manual_seed(hidden * 3 + rows)
    x = rand(rows, hidden, dtype=dtype, gen=gen, offset=2.0)  # a mean far from 0
    w = rand(hidden, dtype=dtype, gen=gen) if affine != "none" else None
    b = rand(hidden, dtype=dtype, gen=gen) if affine == "both" else None
    out = kiln.layer_norm(x, w, b, 1e-5)
    assert out.dtype == dtype
    assert_close_to(out, layer_norm_fp64(x, w, b, 1e-5), dtype)
    if hidden > 1:
        torch.testing.assert_close(
            out.float(), torch.nn.functional.layer_norm(x.float(), (hidden,), None if w is None else w.float(), None if b is None else b.float(), 1e-5),
            rtol=2e-2, atol=2e-2,
        )


def modulation(b, t, d, per_token, dtype, gen):
    return rand(b, t if per_token else 1, d, dtype=dtype, gen=gen) * 0.5


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [7, 64, 2048])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("tables", [False, True, "fp32"])
def test_adaln_and_gated_adaln(dtype, hidden, per_token, norm, tables):
    gen = torch.Generator().manual_seed(hidden + per_token * 10 + (2 if tables == "fp32" else tables))
    b, t = 2, 5
    x = rand(b, t, hidden, dtype=dtype, gen=gen, offset=1.0)
    y = rand(b, t, hidden, dtype=dtype, gen=gen)
    scale, shift, gate = (modulation(b, t, hidden, per_token, dtype, gen) for _ in range(3))
    w = rand(hidden, dtype=dtype, gen=gen) if norm == "rms" else None
    # "fp32": table rows in fp32 whatever x's dtype (Wan's scale_shift_table), added in fp32.
    table_dtype = torch.float32 if tables == "fp32" else dtype
    tg, ts, tsh = (rand(hidden, dtype=table_dtype, gen=gen) if tables else None for _ in range(3))

    out = kiln.adaln(x, scale, shift, w, 1e-6, norm, ts, tsh)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close_to(out, adaln_fp64(x, scale, shift, w, 1e-6, norm, ts, tsh), dtype)

    h2, out2 = kiln.gated_adaln(x, y, gate, scale, shift, w, 1e-6, norm, tg, ts, tsh)
    ref_h2, ref_out2 = gated_adaln_fp64(x, y, gate, scale, shift, w, 1e-6, norm, tg, ts, tsh)
    assert h2.dtype == dtype and out2.dtype == dtype
    assert_close_to(h2, ref_h2, dtype)
    assert_close_to(out2, ref_out2, dtype)


def test_fp32_table_rows_bad_inputs():
    """Table rows are all of x's dtype or all fp32; fp32 rows beside 16-bit x have no backward,
    which a call that records one is told before it runs."""
    x = torch.randn(2, 3, 8).bfloat16()
    m = torch.randn(2, 1, 8).bfloat16()
    rows = torch.randn(3, 8)
    with pytest.raises(TypeError, match=r"kiln\.adaln: table_shift: expected dtype float32 \(as table_scale\), "
                                        r"got bfloat16"):
        kiln.adaln(x, m, m, None, 1e-6, "layer", rows[0], rows[1].bfloat16())
    with pytest.raises(TypeError, match=r"kiln\.gated_adaln: table_gate: expected dtype float32 \(as table_scale\)"):
        kiln.gated_adaln(x, x, m, m, m, None, 1e-6, "layer", rows[2].bfloat16(), rows[0], rows[1])
    with pytest.raises(ValueError, match=r"kiln\.adaln: table_scale: expected shape \[8\] \(x's last dimension\), got \[9\]"):
        kiln.adaln(x, m, m, None, 1e-6, "layer", torch.randn(9), torch.randn(9))
    with pytest.raises(TypeError, match=r"kiln\.adaln: table_scale: expected dtype bfloat16 \(as x\) where autograd "
                                        r"records the call \(fp32 table rows beside 16-bit x have no backward\), got float32"):
        kiln.adaln(x.requires_grad_(), m, m, None, 1e-6, "layer", rows[0], rows[1])
    with pytest.raises(TypeError, match=r"kiln\.adaln: table_scale: expected dtype bfloat16 \(as x\), got float16"):
        kiln.adaln(x.detach(), m, m, None, 1e-6, "layer", rows[0].half(), rows[1].half())


def test_ltx_table_form_matches_the_materialised_sum():
    """diffusers' ada_values = table[None, None] + temb.reshape(B, T, 6, D), unbound: kiln
    reads the temb slices in place and adds the table rows itself."""
    gen = torch.Generator().manual_seed(6)
    b, t, d = 2, 9, 32
    table = torch.randn(6, d, generator=gen) / d**0.5
    temb = torch.randn(b, t, 6 * d, generator=gen)
    h, y = torch.randn(b, t, d, generator=gen), torch.randn(b, t, d, generator=gen)
    ada = table[None, None] + temb.reshape(b, t, 6, d)
    shift_msa, scale_msa, gate_msa = ada[:, :, 0], ada[:, :, 1], ada[:, :, 2]
    view = kiln.ada_values(temb, 6)
    assert view.data_ptr() == temb.data_ptr()
    h2, out = kiln.gated_adaln(h, y, view[:, :, 2], view[:, :, 1], view[:, :, 0], None, 1e-6, "rms", table[2], table[1], table[0])
    ref_h2, ref_out = gated_adaln_fp64(h, y, gate_msa, scale_msa, shift_msa)
    assert_close_to(h2, ref_h2, torch.float32)
    assert_close_to(out, ref_out, torch.float32)


def test_fakes_trace_under_compile():
    def block(x, r, w, scale, shift, gate):
        out, s = kiln.fused_add_rms_norm(x, r, w)
        h2, m = kiln.gated_adaln(s.unsqueeze(0), out.unsqueeze(0), gate, scale, shift, None, 1e-6, "layer")
        return kiln.layer_norm(m + h2) + kiln.adaln(h2, scale, shift)

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    gen = torch.Generator().manual_seed(1)
    x, r, w = torch.randn(5, 16, generator=gen), torch.randn(5, 16, generator=gen), torch.randn(16, generator=gen)
    scale, shift, gate = (torch.randn(1, 1, 16, generator=gen) for _ in range(3))
    torch.testing.assert_close(compiled(x, r, w, scale, shift, gate), block(x, r, w, scale, shift, gate))


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 7, 64, dtype=torch.bfloat16)
        m = torch.empty(2, 1, 64, dtype=torch.bfloat16)
        out, s = torch.ops.kiln.fused_add_rms_norm(x, x, None)
        assert out.shape == s.shape == x.shape and out.dtype == torch.bfloat16
        assert torch.ops.kiln.layer_norm(x).shape == x.shape
        assert torch.ops.kiln.adaln(x, m, m).shape == x.shape
        h2, o = torch.ops.kiln.gated_adaln(x, x, m, m, m)
        assert h2.shape == o.shape == x.shape


def test_opcheck():
    gen = torch.Generator().manual_seed(2)
    x, r, w = torch.randn(4, 3, 32, generator=gen), torch.randn(4, 3, 32, generator=gen), torch.randn(32, generator=gen)
    m = torch.randn(4, 1, 32, generator=gen)
    mt = torch.randn(4, 3, 32, generator=gen)
    cases = [
        (torch.ops.kiln.fused_add_rms_norm.default, (x, r, w, 1e-6)),
        (torch.ops.kiln.fused_add_rms_norm_.default, (x.clone(), r.clone(), w, 1e-6)),
        (torch.ops.kiln.layer_norm.default, (x, w, w, 1e-5)),
        (torch.ops.kiln.layer_norm.default, (x.transpose(0, 1), None, None, 1e-5)),
        (torch.ops.kiln.adaln.default, (x, m, mt, w, 1e-6, "rms", w, w)),
        (torch.ops.kiln.gated_adaln.default, (x, r, m, mt, m, None, 1e-6, "layer", None, None, None)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


def test_fakes_refuse_what_the_table_rows_checks_refuse():
    """Under torch.compile the fakes give the ops' own errors for table rows: one row alone,
    or rows of two dtypes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 3, 8, dtype=torch.bfloat16)
        m = torch.empty(2, 1, 8, dtype=torch.bfloat16)
        rows = torch.empty(3, 8)
        with pytest.raises(ValueError, match=r"kiln\.adaln: table_scale: expected a \[D\] table row, since other "
                                             r"table rows are given, got None"):
            torch.ops.kiln.adaln(x, m, m, None, 1e-6, "layer", None, rows[0])
        with pytest.raises(ValueError, match=r"kiln\.gated_adaln: table_scale: expected a \[D\] table row"):
            torch.ops.kiln.gated_adaln(x, x, m, m, m, None, 1e-6, "layer", rows[0].bfloat16(), None, None)
        with pytest.raises(TypeError, match=r"kiln\.gated_adaln: table_gate: expected dtype torch\.float32 "
                                            r"\(as table_scale\)"):
            torch.ops.kiln.gated_adaln(x, x, m, m, m, None, 1e-6, "layer", rows[0].bfloat16(), rows[1], rows[2])
        out = torch.ops.kiln.gated_adaln(x, x, m, m, m, None, 1e-6, "layer", rows[0], rows[1], rows[2])
        assert out[0].shape == x.shape and out[1].dtype == torch.bfloat16
